"""Offline generation speed with the embedded SmolLM2, side by side in one run:

- our engine, plain greedy decoding, at batch 1 and 16;
- our engine with DSpark (the shipped drafter, or --drafter) at the same batches;
- Hugging Face transformers `generate` on the same prompts and weights (the peer).

    python benchmarks/smollm2_offline.py [--device cpu|cuda] [--model smollm2-135m|PATH.gguf]
        [--dtype float32|bfloat16] [--drafter DIR] [--batches 1,16] [--new-tokens 64] [--out results.json]

--dtype defaults to float32 on CPU and bfloat16 on a GPU (with CUDA graphs), the engine's
defaults; every system runs in the same dtype.

Every system gets the same held-out chat prompts (conversations the shipped drafter never
trained on) and greedy decoding up to --new-tokens tokens, stopping at EOS; tokens/s counts
the tokens generated up to EOS over the wall time of the whole generate call (prefill
included). Each system runs the workload once untimed (kernel compilation, CUDA graphs,
allocator) and then timed; the engine's prefix cache is off, so the timed pass prefills again.
Greedy DSpark commits exactly the plain engine's tokens. Ratios are printed last.
"""

from __future__ import annotations

import argparse
import json
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
from engine.loader.resolve import resolve_model  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.spec.setup import shipped_drafter  # noqa: E402
from tests.data.spec_prompts import spec_prompt_conversations  # noqa: E402


def prompts_for(tokenizer: Any, n: int) -> list[list[int]]:
    return [tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
            for c in spec_prompt_conversations(n)]


def run_engine(engine: EngineCore, prompts: list[list[int]], new_tokens: int) -> tuple[int, float]:
    """(tokens generated, seconds) for the whole batch."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}-{time.perf_counter_ns()}", p, params)
    produced = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            produced += len(out.new_token_ids)
    return produced, time.perf_counter() - start


def generated_until_eos(rows: torch.Tensor, eos: set[int]) -> int:
    """Tokens of each row of `rows` [B, N] up to and including its first EOS."""
    total = 0
    for row in rows.tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
        total += stop + 1
    return total


def run_hf(model_name: str, prompts: list[list[int]], new_tokens: int, device: str, dtype: torch.dtype,
           eos: set[int]) -> float:
    from transformers import AutoModelForCausalLM

    source = resolve_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(str(source.path.parent), gguf_file=source.path.name,
                                                 torch_dtype=dtype).to(device).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        for _ in range(2):  # the first pass warms up; the second is timed
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=sorted(eos), pad_token_id=0)
            elapsed = time.perf_counter() - start
    return generated_until_eos(out[:, width:], eos) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m", help="alias or GGUF path of SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on CPU, else bfloat16")
    parser.add_argument("--drafter", type=Path, help="drafter directory (default: the shipped one)")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    loaded = load_model(args.model, dtype=dtype, device=args.device, progress=False)
    drafter = args.drafter or shipped_drafter("smollm2-135m")
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": args.device, "dtype": str(dtype),
                               "threads": torch.get_num_threads(), "drafter": str(drafter),
                               "new_tokens": args.new_tokens, "rows": []}
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = prompts_for(loaded.tokenizer, batch)
        row: dict[str, Any] = {"batch": batch}
        variants = {"engine": None}
        if drafter is not None:
            variants["engine_dspark"] = SpeculativeConfig(drafter=str(drafter))
        for name, spec in variants.items():
            config = EngineConfig(model=args.model, device=args.device, dtype=str(dtype).removeprefix("torch."),
                                  max_num_seqs=max(batch, 1),
                                  max_model_len=2048, enable_prefix_cache=False, speculative=spec)
            engine = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
            run_engine(engine, prompts, args.new_tokens)  # warm-up pass
            before = engine.stats()
            produced, seconds = run_engine(engine, prompts, args.new_tokens)
            row[name] = produced / seconds
            row[f"{name}_tokens"] = produced
            if spec is not None:
                after = engine.stats()
                verifies = after.spec_verify_steps_total - before.spec_verify_steps_total
                accepted = after.spec_accepted_tokens_total - before.spec_accepted_tokens_total
                row["dspark_mean_accept_len"] = (accepted + verifies) / max(verifies, 1)
        if not args.skip_hf:
            eos = set(loaded.config.eos_token_ids) | set(loaded.tokenizer.eos_token_ids)
            row["transformers"] = run_hf(args.model, prompts, args.new_tokens, args.device, dtype, eos)
            row["engine_vs_transformers"] = row["engine"] / row["transformers"]
        if "engine_dspark" in row:
            row["dspark_vs_engine"] = row["engine_dspark"] / row["engine"]
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    print("\n| batch | engine tok/s | DSpark tok/s (accept) | transformers tok/s | engine / transformers "
          "| DSpark / engine |")
    print("|---|---|---|---|---|---|")
    for r in results["rows"]:
        dspark = f"{r['engine_dspark']:.2f} ({r['dspark_mean_accept_len']:.2f})" if "engine_dspark" in r else None
        cells = [r["batch"], r["engine"], dspark, r.get("transformers"),
                 r.get("engine_vs_transformers"), r.get("dspark_vs_engine")]
        print("| " + " | ".join("-" if c is None else (f"{c:.2f}" if isinstance(c, float) else str(c))
                                for c in cells) + " |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
