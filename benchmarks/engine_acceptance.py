"""The engine's own DSpark acceptance on held-out chat prompts: committed tokens per verify and
P(draft i accepted) per position, from the engine's counters (`EngineCore.stats()`).

The prompts are the held-out ones among the first `--heldout-prompts` N of the built-in prompt
set, rendered as the training plan renders them: the same prompts whose target answers
benchmarks/drafter_acceptance.py walks with `--heldout-prompts N`. There the drafter is walked
over answers the target generated beforehand; here the engine serves the prompts (greedy,
continuous batching, `--max-tokens` new tokens, stopping at EOS), so the figure includes
everything serving adds: its own greedy path in its dtype, KV injection from prefill chunks
and verifies, and the last verify of each request cut short by EOS or the token limit.

    .venv/bin/python benchmarks/engine_acceptance.py --device cpu --dtype bfloat16 --batch 16 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.loader.resolve import shipped_drafter  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from training.data import ChatTokenizer  # noqa: E402
from training.generate import GenerationPlan, plan_jobs  # noqa: E402
from training.prompts import build_prompt_set  # noqa: E402


def heldout_prompt_ids(tokenizer: ChatTokenizer, num_prompts: int) -> list[list[int]]:
    plan = GenerationPlan(temperatures=(0.0,))
    prompts = build_prompt_set(num_prompts, plan.seed)  # a prefix of any larger set
    return [job.prompt_ids for chunk in plan_jobs(prompts, tokenizer, plan) for job in chunk if job.heldout]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the target: alias, GGUF or HF directory")
    parser.add_argument("--drafter", type=Path, help="drafter directory (default: the model's shipped one)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--heldout-prompts", type=int, default=16384, help="the first N built-in prompts")
    parser.add_argument("--limit", type=int, help="serve only the first K held-out prompts")
    parser.add_argument("--batch", type=int, default=16, help="requests running at once")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    loaded = load_model(args.model, dtype=dtype, device=args.device, progress=False)
    drafter = args.drafter or shipped_drafter(loaded.name)
    if drafter is None:
        raise SystemExit(f"no drafter ships with {loaded.name}: pass --drafter")
    prompts = heldout_prompt_ids(loaded.tokenizer, args.heldout_prompts)[: args.limit]
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.batch,
        max_model_len=2048,
        speculative=SpeculativeConfig(drafter=str(drafter)),
    )
    engine = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(f"heldout-{i}", ids, params)
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(out.new_token_ids) for out in engine.step())
    seconds = time.perf_counter() - start

    stats = engine.stats()
    verifies = stats.spec_verify_steps_total
    accept_len = (stats.spec_accepted_tokens_total + verifies) / max(verifies, 1)
    per_position = [n / max(verifies, 1) for n in stats.spec_accepted_per_position]
    print(
        f"{len(prompts)} held-out prompts, {generated} tokens in {seconds:.0f} s ({generated / seconds:.1f} tokens/s)"
    )
    print(f"drafter {drafter}; {args.dtype} on {args.device}, batch {args.batch}")
    print("committed tokens / verify " + " ".join(f"P(d{i})" for i in range(len(per_position))))
    print(f"{accept_len:>25.3f} " + " ".join(f"{p:>5.3f}" for p in per_position) + f"   ({verifies} verifies)")
    if args.json:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "model": args.model,
            "drafter": str(drafter),
            "device": args.device,
            "dtype": args.dtype,
            "batch": args.batch,
            "max_tokens": args.max_tokens,
            "heldout_prompts_of": args.heldout_prompts,
            "prompts": len(prompts),
            "generated_tokens": generated,
            "seconds": round(seconds, 1),
            "verifies": verifies,
            "accept_len": accept_len,
            "per_position": per_position,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
