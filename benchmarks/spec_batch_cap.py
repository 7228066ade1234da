"""Where DSpark stops paying, step by step: at each batch size, the time of a plain decode
step, of a DSpark step (draft + verify; tokens committed per request counted) and of a
DSpark step without drafting (what `SpeculativeConfig.max_batch_size` runs above the cap),
measured on the same requests in alternating blocks of steps.

    python benchmarks/spec_batch_cap.py [--device cpu|cuda] [--dtype bfloat16|float32]
        [--batches 1,2,4,8,16] [--blocks 12] [--steps-per-block 4] [--out results.json]

Three engines (plain; DSpark; DSpark with max_batch_size=1, which never drafts at batch 2
and above) each hold `batch` held-out chat prompts decoding greedily with EOS ignored. The
engines take turns, a block of steps on each, then the next block, so that a slow spell of
a shared machine lands on all of them; each engine's figure is the median over blocks. Effective tokens/s
is batch × tokens per request per step ÷ step time. The table ends with DSpark ÷ plain
and undrafted ÷ plain: a cap belongs where the first falls below 1, and the second says
what staying in step (capturing the drafter's layers, injecting the drafter's KV) costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.loader.resolve import shipped_drafter  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from tests.data.spec_prompts import spec_prompt_conversations  # noqa: E402


def engine_with_requests(
    loaded: Any, prompts: list[list[int]], device: str, dtype: str, spec: SpeculativeConfig | None
) -> EngineCore:
    config = EngineConfig(
        model="smollm2-135m",
        device=device,
        dtype=dtype,
        max_num_seqs=len(prompts),
        max_model_len=2048,
        enable_prefix_cache=False,
        speculative=spec,
    )
    engine = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
    params = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"cap-{i}", prompt, params)
    while any(r.kv_len < len(r.prompt_ids) for r in engine.requests.values()):  # prefill done
        engine.step()
    for _ in range(3):  # warm
        engine.step()
    return engine


def committed(engine: EngineCore) -> int:
    return sum(len(r.output_ids) for r in engine.requests.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps-per-block", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    loaded = load_model("smollm2-135m", dtype=getattr(torch, args.dtype), device=args.device, progress=False)
    tokenizer = loaded.tokenizer
    drafter = shipped_drafter("smollm2-135m")
    assert drafter is not None, "the shipped SmolLM2 drafter is missing"
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        conversations = spec_prompt_conversations(max(batch, 2))[:batch]
        prompts = [
            tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
            for c in conversations
        ]
        variants: dict[str, SpeculativeConfig | None] = {
            "plain": None,
            "dspark": SpeculativeConfig(drafter=str(drafter)),
        }
        if batch > 1:  # a cap of 1 drafts at batch 1
            variants["undrafted"] = SpeculativeConfig(drafter=str(drafter), max_batch_size=1)
        engines = {
            name: engine_with_requests(loaded, prompts, args.device, args.dtype, spec)
            for name, spec in variants.items()
        }
        step_ms: dict[str, list[float]] = {name: [] for name in engines}
        tokens_per_step: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.blocks):
            for name, engine in engines.items():
                before = committed(engine)
                start = time.perf_counter()
                for _ in range(args.steps_per_block):
                    engine.step()
                step_ms[name].append(1e3 * (time.perf_counter() - start) / args.steps_per_block)
                tokens_per_step[name].append((committed(engine) - before) / args.steps_per_block / batch)
        row: dict[str, Any] = {"batch": batch}
        for name in engines:
            ms = statistics.median(step_ms[name])
            per_request = statistics.mean(tokens_per_step[name])
            row[name] = {
                "ms_per_step": ms,
                "tokens_per_request_step": per_request,
                "tokens_per_s": batch * per_request / ms * 1e3,
            }
        row["dspark_vs_plain"] = row["dspark"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        if "undrafted" in row:
            row["undrafted_vs_plain"] = row["undrafted"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| batch | plain ms/step | DSpark ms/step (tokens/request/step) | undrafted ms/step ", end="")
    print("| DSpark / plain | undrafted / plain |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        undrafted = r.get("undrafted")
        print(
            f"| {r['batch']} | {r['plain']['ms_per_step']:.1f} | {r['dspark']['ms_per_step']:.1f} "
            f"({r['dspark']['tokens_per_request_step']:.2f}) | "
            + (f"{undrafted['ms_per_step']:.1f}" if undrafted else "-")
            + f" | {r['dspark_vs_plain']:.2f} | "
            + (f"{r['undrafted_vs_plain']:.2f}" if undrafted else "-")
            + " |"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"date": time.strftime("%Y-%m-%d"), "args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2
            )
        )


if __name__ == "__main__":
    main()
