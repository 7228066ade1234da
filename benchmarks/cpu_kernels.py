"""The C kernels of engine/kernels/cpu against the torch paths they replace, on CPU.

    python benchmarks/cpu_kernels.py [--rounds 3] [--steps 30] [--out results.json]

Three parts, each printing a table:

1. bf16 GEMMs alone (where the CPU has AMX): SmolLM2-135M's 120 layer weights and its LM
   head, one call each in turn so that the weights stream from memory as in a step, packed
   for oneDNN and packed for the AMX tile kernel, at 1, 8, 16 and 128 rows, the two
   alternating, best of 5; and the MLP's gate/up product with SwiGLU fused into the tile
   kernel against the product then the separate silu_and_mul kernel.
2. Attention alone at SmolLM2's heads (9 q / 3 kv, head 64): the torch path (padded K/V
   gather + SDPA) and the C kernel on the same random forward, decode (1 row per request)
   and a DSpark verify window (8 rows), keys spread over a shuffled pool; median of repeats.
3. The engine's decode step with the embedded SmolLM2 (bf16 and fp32, batch 1 and 16, the
   prompts of benchmarks/smollm2_offline.py, steady state after 40 steps): with all the
   kernels (`DSPARK_CPU_KERNELS=1`), without the one-call decoder stack
   (`attention,elementwise,gemm,gemv`: the layers' Python forward), without our linear kernels
   either (`attention,elementwise`: bf16 linears on oneDNN, fp32 on torch's dense F.linear) and
   without any (`0`). Each in a fresh process, alternating for --rounds
   rounds so that a slow spell of a shared machine falls on all; the table gives the median
   ms per step and the ratios.
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


def _each_linear(weights: list[tuple[torch.Tensor, int]], inputs: dict[int, torch.Tensor]) -> None:
    """Every (packed weight, its K) once, on the input of that K."""
    from engine.kernels.cpu import linear as cpu_linear

    for w, k in weights:
        cpu_linear.linear(inputs[k], w)


def _each_swiglu(weights: list[torch.Tensor], x: torch.Tensor, fused: bool) -> None:
    from engine.kernels.activation import silu_and_mul
    from engine.kernels.cpu import linear as cpu_linear

    for w in weights:
        if fused:
            cpu_linear.linear_swiglu(x, w)
        else:
            silu_and_mul(cpu_linear.linear(x, w))


def gemm_rows() -> list[dict[str, Any]]:
    from engine.kernels.cpu import gemm

    layer_shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
    dense = [torch.randn(*shape, dtype=torch.bfloat16) * 0.02 for _ in range(30) for shape in layer_shapes]
    dense.append(torch.randn(49152, 576, dtype=torch.bfloat16) * 0.02)  # the LM head
    onednn = [(torch.ops.mkldnn._reorder_linear_weight(w, 16), w.shape[1]) for w in dense]
    tiles = [(gemm.pack(w), w.shape[1]) for w in dense]
    gate_up = [w for w in dense if w.shape == (3072, 576)]
    gate_up_onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in gate_up]
    gate_up_gated = [gemm.pack_gated(w) for w in gate_up]
    del dense

    def best_ms(fn: Any) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best * 1e3

    rows = []
    for m in (1, 8, 16, 128):
        inputs = {k: torch.randn(m, k, dtype=torch.bfloat16) for k in (576, 1536)}
        variants = {
            "onednn_ms": partial(_each_linear, onednn, inputs),
            "amx_ms": partial(_each_linear, tiles, inputs),
            "swiglu_onednn_ms": partial(_each_swiglu, gate_up_onednn, inputs[576], False),
            "swiglu_amx_ms": partial(_each_swiglu, gate_up_gated, inputs[576], True),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(3):  # alternate, so that a slow spell falls on every variant
            for name, fn in variants.items():
                times[name].append(best_ms(fn))
        row: dict[str, Any] = {"rows": m, **{name: min(t) for name, t in times.items()}}
        row["speedup"] = row["onednn_ms"] / row["amx_ms"]
        row["swiglu_speedup"] = row["swiglu_onednn_ms"] / row["swiglu_amx_ms"]
        row["amx_gb_per_s"] = sum(w.numel() * 2 for w, _ in tiles) / row["amx_ms"] / 1e6
        rows.append(row)
    return rows


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


# DSPARK_CPU_KERNELS settings: everything, no one-call decoder stack, no linear kernel of ours either, none
KERNEL_SETS = {
    "all": "1", "no_stack": "attention,elementwise,gemm,gemv", "no_gemm": "attention,elementwise", "none": "0"
}  # fmt: skip


def engine_rows(rounds: int, steps: int) -> list[dict[str, Any]]:
    cases = [(dtype, batch) for dtype in ("bfloat16", "float32") for batch in (1, 16)]
    results: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(rounds):
        for dtype, batch in cases:
            for name, kernels in KERNEL_SETS.items():
                env = dict(os.environ, DSPARK_CPU_KERNELS=kernels)
                command = [sys.executable, __file__, "--child", f"{dtype},{batch},{steps}"]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
                results.setdefault((dtype, batch, name), []).append(float(out.strip().splitlines()[-1]))
    rows = []
    for dtype, batch in cases:
        row: dict[str, Any] = {"dtype": dtype, "batch": batch}
        for name in KERNEL_SETS:
            runs = results.get((dtype, batch, name))
            row[f"{name}_ms"] = statistics.median(runs) if runs else float("nan")
            row[f"runs_{name}"] = runs or []
        row["all_vs_none"] = row["none_ms"] / row["all_ms"]
        row["all_vs_no_stack"] = row["no_stack_ms"] / row["all_ms"]
        row["no_stack_vs_no_gemm"] = row["no_gemm_ms"] / row["no_stack_ms"]
        rows.append(row)
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
    from engine.kernels.cpu import gemm
    from engine.kernels.cpu.build import load

    if load("attention") is None or load("elementwise") is None:
        sys.exit("the C kernels cannot be built here (see the warning above)")
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "threads": torch.get_num_threads(),
        "gemm": gemm_rows() if gemm.available() else [],
        "attention": attention_rows(),
        "engine_step": engine_rows(args.rounds, args.steps),
    }
    if results["gemm"]:
        gemm_columns = ["rows", "onednn_ms", "amx_ms", "speedup", "amx_gb_per_s"]
        print_table(results["gemm"], gemm_columns + ["swiglu_onednn_ms", "swiglu_amx_ms", "swiglu_speedup"])
        print()
    print_table(results["attention"], ["dtype", "batch", "context", "window", "torch_us", "kernel_us", "speedup"])
    print()
    step_columns = ["dtype", "batch", "none_ms", "no_gemm_ms", "no_stack_ms", "all_ms"]
    step_columns += ["all_vs_none", "all_vs_no_stack", "no_stack_vs_no_gemm"]
    print_table(results["engine_step"], step_columns)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
