"""Batch-1 GEMV bandwidth of the CPU linear kernels at each ISA level this CPU can build, as a
share of a plain copy: gemv.c on fp32 and bf16 packed weights, and quant_gemm.c on GGUF blocks
(the embedded model's formats: Q4_1 layers, a Q8_0 head; random quants).

    python benchmarks/cpu_gemv.py [--rounds 5] [--out results.json]

Shapes: SmolLM2-135M's 30 layers (qkv 960 x 576, o 576 x 576, gate/up 3072 x 576, down
576 x 1536) and its LM head (49152 x 576), about 4x the last-level cache in fp32 (and still
past it in Q4_1 on the 2-core VM's 32 MB), so the weights stream from memory as in a decode
step: one row through every weight in turn, best of --rounds. The copy reads and writes a
buffer of the layers' bytes (torch's copy_); its GB/s count the bytes read, so the share
compares read streams. Each level runs in a child process with DSPARK_CPU_ISA set (isa.py),
with torch's thread count; on a shared machine run it when quiet.

    python benchmarks/cpu_gemv.py --rows 1,4,16,64,256 [--baseline REV] [--rounds 3]

instead times each linear shape of the model at those row counts (prefill and batched decode),
at this process's DSPARK_CPU_ISA: fp32 on gemv.c's packing against quant_gemm.c's Q4_1 and Q8_0
on random blocks, and with --baseline, quant_gemm.c as git revision REV had it (built from
that revision's kernel sources, by build.py's command). Each shape streams 30 weights, as the
layers do (the LM head one), ms per call; every system runs once per round, interleaved in an
order rotated each round, after a warm-up round, and each figure is the best of --rounds rounds."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate/up, down
VOCAB, HIDDEN, LAYERS = 49152, 576, 30


def best_s(fn: Any, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def random_blocks(fmt: str, n: int, k: int) -> torch.Tensor:
    """A random [n, row_bytes] GGUF weight in `fmt`: fp16 scales (and Q4_1 minimums) of a
    trained model's magnitude, random quants."""
    from engine.kernels.cpu.quant_gemm import FORMATS

    blocks, row_bytes = n * k // 32, FORMATS[fmt].row_bytes(k)
    header = 2 if fmt == "Q8_0" else 4  # fp16 d (and m), then the quants
    raw = torch.randint(0, 256, (blocks, row_bytes * n // blocks), dtype=torch.uint8)
    raw[:, :header] = (torch.rand(blocks, header // 2) * 1e-2).to(torch.float16).view(torch.uint8)
    return raw.view(n, row_bytes)


def level_row(dtype: str, rounds: int) -> dict[str, Any]:
    """GB/s of the GEMVs and of the copy, in this process (its DSPARK_CPU_ISA). `dtype`:
    float32 or bfloat16 (gemv.c on packed weights), or Q4_1 (quant_gemm.c on the embedded
    model's formats: Q4_1 layers, a Q8_0 head)."""
    from engine.kernels.cpu import gemv, quant_gemm

    linear: Any
    if dtype == "Q4_1":
        weights = [random_blocks("Q4_1", n, k) for _ in range(LAYERS) for n, k in LAYER_SHAPES]
        head = random_blocks("Q8_0", VOCAB, HIDDEN)
        inputs = {k: torch.randn(1, k) for k in (576, 1536)}
        in_features = {id(w): k for w, (_, k) in zip(weights, LAYER_SHAPES * LAYERS, strict=True)}
        in_features[id(head)] = HIDDEN
        formats = {id(head): "Q8_0"}

        def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return quant_gemm.linear_q(x, w, formats.get(id(w), "Q4_1"))

        isa_name = gemv.isa_name()  # the libraries share the build level
    else:
        torch_dtype = getattr(torch, dtype)
        weights = [gemv.pack(torch.randn(n, k).to(torch_dtype) * 0.02) for _ in range(LAYERS) for n, k in LAYER_SHAPES]
        head = gemv.pack(torch.randn(VOCAB, HIDDEN).to(torch_dtype) * 0.02)
        inputs = {k: torch.randn(1, k).to(torch_dtype) for k in (576, 1536)}
        in_features = {id(w): gemv.in_features(w) for w in [*weights, head]}
        linear, isa_name = gemv.linear, gemv.isa_name()

    def layers() -> None:
        for w in weights:
            linear(inputs[in_features[id(w)]], w)

    layer_bytes = sum(w.numel() * w.element_size() for w in weights)
    head_bytes = head.numel() * head.element_size()
    source = torch.empty(layer_bytes // 4)
    target = torch.empty_like(source)
    copy_gbs = layer_bytes / best_s(lambda: target.copy_(source), rounds) / 1e9
    layers_gbs = layer_bytes / best_s(layers, rounds) / 1e9
    head_gbs = head_bytes / best_s(lambda: linear(inputs[HIDDEN], head), rounds) / 1e9
    return {
        "isa": isa_name, "dtype": dtype, "threads": torch.get_num_threads(),
        "copy_gb_s": copy_gbs, "layers_gb_s": layers_gbs, "head_gb_s": head_gbs,
        "layers_vs_copy": layers_gbs / copy_gbs, "head_vs_copy": head_gbs / copy_gbs,
    }  # fmt: skip


_LINEAR_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]  # fmt: skip


def baseline_library(revision: str, directory: Path) -> ctypes.CDLL:
    """quant_gemm.c of git `revision`, with the headers it had, built into `directory` by
    build.py's command for this process's ISA target."""
    from engine.kernels.cpu import build, isa

    folder = "engine/kernels/cpu"
    listing = ["git", "ls-tree", "--name-only", f"{revision}:{folder}"]
    for name in subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split():
        if name.endswith((".c", ".h")):
            show = ["git", "show", f"{revision}:{folder}/{name}"]
            (directory / name).write_bytes(subprocess.run(show, cwd=ROOT, capture_output=True, check=True).stdout)
    compiler = build._compiler()
    assert compiler is not None, "no C compiler"
    output = directory / "quant_gemm_baseline.so"
    here, source = str(build.SOURCE_DIR), str(build.SOURCE_DIR / "quant_gemm.c")
    moved = {here: str(directory), source: str(directory / "quant_gemm.c")}
    command = build.compile_command("quant_gemm", compiler, isa.target(), output)
    subprocess.run([moved.get(part, part) for part in command], check=True)
    return ctypes.CDLL(str(output))


def quantized_linear(function: Any) -> Any:
    """quant_gemm.c's linear_<fmt> (this tree's or a baseline's) on x [M, K] and blocks [N, *]."""
    function.argtypes, function.restype = _LINEAR_ARGS, ctypes.c_int

    def linear(x: torch.Tensor, w: torch.Tensor) -> None:
        m, k, n = x.shape[0], x.shape[1], w.shape[0]
        out = torch.empty(m, n)
        status = function(x.data_ptr(), k, w.data_ptr(), None, out.data_ptr(), n, m, n, k, torch.get_num_threads())
        assert status == 0

    return linear


def rows_table(row_counts: list[int], rounds: int, baseline: str | None) -> list[dict[str, Any]]:
    """ms per call of each layer shape and the LM head at each row count (module docstring)."""
    from engine.kernels.cpu import build, gemv

    libraries = {"": build.load("quant_gemm")}
    with tempfile.TemporaryDirectory() as scratch:
        if baseline:
            libraries[" before"] = baseline_library(baseline, Path(scratch))
        rows = []
        for n, k in [*LAYER_SHAPES, (VOCAB, HIDDEN)]:
            copies = 1 if n == VOCAB else LAYERS
            systems = {"fp32": (gemv.linear, [gemv.pack(torch.randn(n, k) * 0.02) for _ in range(copies)])}
            for fmt in ("Q4_1", "Q8_0"):
                for suffix, library in libraries.items():  # each its own copies: none finds another's in cache
                    blocks = [random_blocks(fmt, n, k) for _ in range(copies)]
                    systems[fmt + suffix] = (quantized_linear(getattr(library, f"linear_{fmt.lower()}")), blocks)
            for m in row_counts:
                x = torch.randn(m, k)
                best = dict.fromkeys(systems, float("inf"))
                order = list(systems)
                for round_index in range(rounds + 1):  # the first round warms up; each round rotates the order
                    for name in order[round_index % len(order) :] + order[: round_index % len(order)]:
                        linear, weights = systems[name]
                        start = time.perf_counter()
                        for w in weights:
                            linear(x, w)
                        best[name] = min(best[name], (time.perf_counter() - start) / copies * 1e3)
                row: dict[str, Any] = {"shape": f"{n}x{k}", "rows": m, **{f"{s} ms": t for s, t in best.items()}}
                for fmt in ("Q4_1", "Q8_0"):
                    row[f"fp32 / {fmt}"] = best["fp32"] / best[fmt]
                    if baseline:
                        row[f"fp32 / {fmt} before"] = best["fp32"] / best[f"{fmt} before"]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", help="comma-separated row counts: the per-shape table instead")
    parser.add_argument("--baseline", help="git revision whose quant_gemm.c the --rows table adds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(level_row(args.child, args.rounds)))
        return
    if args.rows:
        from engine.kernels.cpu import gemv

        table = rows_table([int(m) for m in args.rows.split(",")], args.rounds, args.baseline)
        print(f"isa {gemv.isa_name()}, {torch.get_num_threads()} threads, best of {args.rounds} interleaved rounds")
        print_table(table)
        if args.out:
            args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": table}, indent=2))
        return
    from engine.kernels.cpu import isa

    rows = []
    for level in ("native", *reversed(isa.levels_below_cpu())):
        for dtype in ("float32", "bfloat16", "Q4_1"):
            env = dict(os.environ, DSPARK_CPU_ISA=level)
            command = [sys.executable, __file__, "--child", dtype, "--rounds", str(args.rounds)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            rows.append({"level": level, **json.loads(out.strip().splitlines()[-1])})
    columns = ["level", "isa", "dtype", "threads", "copy_gb_s", "layers_gb_s", "layers_vs_copy"]
    columns += ["head_gb_s", "head_vs_copy"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |")
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
