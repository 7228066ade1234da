"""The decode step's linears at a few rows: cuBLAS (F.linear, then the SwiGLU kernel) against
the skinny Triton kernel (engine/kernels/triton/skinny_linear.py) over its launch shapes, in
the regime of a real step (random weights in a Llama-3-8B shape, bf16).

    python benchmarks/skinny_linear_sweep.py [--rows 1,2,4,8] [--layers 32] [--out sweep.json]

Each projection (qkv, o, gate_up with SwiGLU, down; the LM head) is timed as a chain over
`layers` distinct weights (four copies of the LM head) captured in one CUDA graph, as a
decode step reads them: no weight is in L2 when its turn comes, and launches cost what they
cost in a replayed graph. The rate is the weight bytes over the chain's time, as a share of a
plain device copy measured in the same run. Every configuration is checked against F.linear
on the same inputs first. The next table sums the projections over one step (the LM head
once, the others once per layer) for cuBLAS, the best configuration per projection, and the
kernel's default; the last times the projections a norm precedes with the norm (residual
add and RMSNorm) as its own kernel against the kernel's norm form, at one and two rows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.triton.activation import silu_and_mul_triton  # noqa: E402
from engine.kernels.triton.norm import add_rms_norm_triton  # noqa: E402
from engine.kernels.triton.skinny_linear import (  # noqa: E402
    RowNorm,
    SkinnyConfig,
    default_config,
    skinny_linear_triton,
    skinny_norm_linear_triton,
)

HIDDEN, INTER, Q_HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 128256
# projection -> (weight rows, input features, gated)
PROJECTIONS = {
    "qkv": ((Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, False),
    "o": (HIDDEN, Q_HEADS * HEAD_DIM, False),
    "gate_up": (2 * INTER, HIDDEN, True),
    "down": (HIDDEN, INTER, False),
    "lm_head": (VOCAB, HIDDEN, False),
}
# outputs are about N(0, 1); two bf16 roundings of fp32 sums in different orders differ by
# an ulp or two of bf16 (2**-7 relative) at most
MAX_ABS_ERROR = 0.1
# above two rows, products per step past this spill registers (sm_90, 4 warps: 8 rows x 8 x 512
# take 128 registers with no spill)
MAX_STEP_PRODUCT = 32768
LM_HEAD_COPIES = 4  # 1 GB each: a chain of four still reads from HBM, as the step's one does
CONFIGS = [
    SkinnyConfig(block_n, block_k, warps, wide)
    for block_n, block_k, warps, wide in itertools.product((4, 8, 16), (256, 512, 1024), (4, 8), (True, False))
    if not (wide and block_n * block_k > 8192)  # a wide accumulator past 64 fp32 registers a thread spills
]


def copy_rate() -> float:
    src = torch.randn(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / graph_time(lambda: dst.copy_(src))


def graph_time(fn: Callable[[], object], replays: int = 10) -> float:
    """Seconds per call of `fn`, captured once in a CUDA graph and replayed (median)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def cublas(x: torch.Tensor, w: torch.Tensor, gated: bool) -> torch.Tensor:
    y = F.linear(x, w)
    return silu_and_mul_triton(y) if gated else y


def chain_time(weights: list[torch.Tensor], x: torch.Tensor, gated: bool, config: SkinnyConfig | None) -> float:
    def run() -> None:
        for w in weights:
            if config is None:
                cublas(x, w, gated)
            else:
                skinny_linear_triton(x, w, gated=gated, config=config)

    return graph_time(run)


def norm_chain_time(weights: list[torch.Tensor], x: torch.Tensor, gated: bool, form: str) -> float:
    """A chain of (residual add + RMSNorm, projection): the norm kernel then cuBLAS, the norm
    kernel then the skinny kernel, or the skinny kernel's norm form (one launch)."""
    residual = torch.randn_like(x)
    norm = RowNorm(torch.ones(x.shape[-1], device=x.device, dtype=x.dtype), 1e-5, residual)

    def run() -> None:
        for w in weights:
            if form == "fused":
                skinny_norm_linear_triton(x, norm, w, gated=gated)
                continue
            normed, _ = add_rms_norm_triton(x, residual, norm.weight, norm.eps)
            if form == "norm + cuBLAS":
                cublas(normed, w, gated)
            else:
                skinny_linear_triton(normed, w, gated=gated)

    return graph_time(run)


def norm_table(weights: dict[str, list[torch.Tensor]], rows_list: list[int]) -> list[dict[str, Any]]:
    """The projections a norm precedes (qkv, gate_up), at the rows the norm form serves."""
    forms = ("norm + cuBLAS", "norm + skinny", "fused")
    print(f"\n| rows | projection | {' ms | '.join(forms)} ms | fused / norm + cuBLAS |")
    print("|---:|---|---:|---:|---:|---:|")
    out = []
    for rows in (r for r in rows_list if r <= 2):
        for name in ("qkv", "gate_up"):
            gated = PROJECTIONS[name][2]
            x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
            times = {form: norm_chain_time(weights[name], x, gated, form) for form in forms}
            out.append({"rows": rows, "proj": name, **times})
            cells = " | ".join(f"{times[form] * 1e3:.3f}" for form in forms)
            print(f"| {rows} | {name} | {cells} | {times['fused'] / times['norm + cuBLAS']:.3f} |", flush=True)
    return out


def config_label(config: SkinnyConfig) -> str:
    return f"{config.block_n}x{config.block_k}/w{config.num_warps}/{'wide' if config.wide_acc else 'step'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw = copy_rate()
    print(f"{torch.cuda.get_device_name()}: copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    weights = {
        name: [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
            for _ in range(LM_HEAD_COPIES if name == "lm_head" else args.layers)
        ]
        for name, (n, k, _) in PROJECTIONS.items()
    }
    # a chain's share of one step: the LM head is read once per step, the rest once per layer
    per_step = {name: 1 / len(chain) if name == "lm_head" else 1.0 for name, chain in weights.items()}
    results: list[dict[str, Any]] = []
    best: dict[tuple[int, str], tuple[float, str]] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n, k, gated) in PROJECTIONS.items():
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            reference = cublas(x, weights[name][0], gated)
            nbytes = len(weights[name]) * n * k * 2
            base = chain_time(weights[name], x, gated, None)
            results.append(
                {"rows": rows, "proj": name, "config": "cublas", "s": base, "share": nbytes / base / copy_bw}
            )
            for config in [*CONFIGS, None]:
                chosen = config or default_config(rows, n // 2 if gated else n, k)
                label = "default" if config is None else config_label(chosen)
                if rows > 2 and (chosen.wide_acc or rows * chosen.block_n * chosen.block_k > MAX_STEP_PRODUCT):
                    continue
                got = skinny_linear_triton(x, weights[name][0], gated=gated, config=chosen)
                error = (got.float() - reference.float()).abs().max().item()
                if error > MAX_ABS_ERROR:
                    print(f"rows {rows} {name} {label}: off F.linear by {error:.3g}, skipped", flush=True)
                    continue
                s = chain_time(weights[name], x, gated, chosen)
                results.append({"rows": rows, "proj": name, "config": label, "s": s, "share": nbytes / s / copy_bw})
                if config is not None and s < best.get((rows, name), (float("inf"), ""))[0]:
                    best[(rows, name)] = (s, label)
            print(
                f"rows {rows} {name:8s} cublas {base * 1e3:.3f} ms ({nbytes / base / copy_bw:.1%}), "
                f"best {best[(rows, name)][1]} {best[(rows, name)][0] * 1e3:.3f} ms "
                f"({nbytes / best[(rows, name)][0] / copy_bw:.1%})",
                flush=True,
            )
    print("\n| rows | cuBLAS step matmuls ms | best per projection ms | default ms | best / cuBLAS |")
    print("|---:|---:|---:|---:|---:|")
    for rows in sorted({r["rows"] for r in results}):

        def total(config: str, rows: int = rows) -> float:
            return sum(r["s"] * per_step[r["proj"]] for r in results if r["rows"] == rows and r["config"] == config)

        best_total = sum(best[(rows, name)][0] * per_step[name] for name in PROJECTIONS)
        print(
            f"| {rows} | {total('cublas') * 1e3:.3f} | {best_total * 1e3:.3f} | {total('default') * 1e3:.3f} | "
            f"{best_total / total('cublas'):.3f} |"
        )
    norms = norm_table(weights, sorted({r["rows"] for r in results}))
    if args.out:
        args.out.write_text(json.dumps({"copy_bytes_per_s": copy_bw, "results": results, "norm": norms}, indent=1))


if __name__ == "__main__":
    main()
