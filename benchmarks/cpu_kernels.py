"""The C kernels of engine/kernels/cpu against the torch paths they replace, on CPU.

    python benchmarks/cpu_kernels.py [--rounds 3] [--steps 30] [--out results.json]

Two parts, each printing a table:

1. Attention alone at SmolLM2's heads (9 q / 3 kv, head 64): the torch path (padded K/V
   gather + SDPA) and the C kernel on the same random forward, decode (1 row per request)
   and a DSpark verify window (8 rows), keys spread over a shuffled pool; median of repeats.
2. The engine's decode step with the embedded SmolLM2 (bf16 and fp32, batch 1 and 16, the
   prompts of benchmarks/smollm2_offline.py, steady state after 40 steps): once with the
   kernels (`DSPARK_CPU_KERNELS=1`) and once without (`=0`), each in a fresh process, the
   two alternating for --rounds rounds so that a slow spell of a shared machine falls on
   both; the table gives the median ms per step and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "attention"))


def median_us(fn: Any, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def attention_rows() -> list[dict[str, Any]]:
    from attention_cases import make_case

    from engine.attention import TorchAttentionBackend

    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for batch, context, window in ((1, 400, 1), (16, 150, 1), (16, 400, 1), (1, 400, 8), (16, 200, 8)):
            gen = torch.Generator().manual_seed(batch * context + window)
            prefix = torch.randint(context // 2, context, (batch,), generator=gen).tolist()
            case = make_case(
                0, [window] * batch, prefix, num_q_heads=9, num_kv_heads=3, head_dim=64, uniform=True, dtype=dtype
            )
            k_cache, v_cache = case.clone_caches()
            row: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "batch": batch}
            row.update(context=context, window=window)
            for name, use_kernel in (("torch_us", False), ("kernel_us", True)):
                backend = TorchAttentionBackend(cpu_kernel=use_kernel)
                row[name] = median_us(
                    partial(backend.forward, case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale)
                )
            row["speedup"] = row["torch_us"] / row["kernel_us"]
            rows.append(row)
    return rows


def step_ms(dtype: str, batch: int, steps: int) -> float:
    """Median ms of a steady-state decode step of `batch` requests (run in a child process)."""
    from smollm2_offline import prompts_for

    from engine.config import EngineConfig
    from engine.core import EngineCore
    from engine.sampling_params import SamplingParams

    config = EngineConfig(
        model="smollm2-135m", device="cpu", dtype=dtype, max_num_seqs=batch, max_model_len=2048,
        enable_prefix_cache=False,
    )  # fmt: skip
    engine = EngineCore(config)
    prompts = prompts_for(engine.tokenizer, batch)
    params = SamplingParams(max_tokens=40 + steps + 8, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(40):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def engine_rows(rounds: int, steps: int) -> list[dict[str, Any]]:
    results: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(rounds):
        for dtype in ("bfloat16", "float32"):
            for batch in (1, 16):
                for kernels in ("1", "0"):
                    env = dict(os.environ, DSPARK_CPU_KERNELS=kernels)
                    command = [sys.executable, __file__, "--child", f"{dtype},{batch},{steps}"]
                    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
                    results.setdefault((dtype, batch, kernels), []).append(float(out.strip().splitlines()[-1]))
    rows = []
    for dtype in ("bfloat16", "float32"):
        for batch in (1, 16):
            with_kernels = statistics.median(results[(dtype, batch, "1")])
            without = statistics.median(results[(dtype, batch, "0")])
            rows.append(
                {
                    "dtype": dtype, "batch": batch, "torch_ms": without, "kernels_ms": with_kernels,
                    "speedup": without / with_kernels, "runs_torch": results[(dtype, batch, "0")],
                    "runs_kernels": results[(dtype, batch, "1")],
                }
            )  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        dtype, batch, steps = args.child.split(",")
        print(step_ms(dtype, int(batch), int(steps)))
        return
    from engine.kernels.cpu.build import load

    if load("attention") is None or load("elementwise") is None:
        sys.exit("the C kernels cannot be built here (see the warning above)")
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "threads": torch.get_num_threads(),
        "attention": attention_rows(),
        "engine_step": engine_rows(args.rounds, args.steps),
    }
    print_table(results["attention"], ["dtype", "batch", "context", "window", "torch_us", "kernel_us", "speedup"])
    print()
    print_table(results["engine_step"], ["dtype", "batch", "torch_ms", "kernels_ms", "speedup"])
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
