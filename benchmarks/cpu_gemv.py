"""Batch-1 GEMV bandwidth of the CPU linear kernels at each ISA level this CPU can build, as a
share of a plain read: gemv.c on fp32 and bf16 packed weights, and quant_gemm.c on GGUF blocks
(the embedded model's formats: Q4_1 layers, a Q8_0 head; random quants).

    python benchmarks/cpu_gemv.py [--rounds 5] [--levels native] [--out results.json]

Shapes: SmolLM2-135M's 30 layers (qkv 960 x 576, o 576 x 576, gate/up 3072 x 576, down
576 x 1536) and its LM head (49152 x 576), about 4x the last-level cache in fp32 (and still
past it in Q4_1 on the 2-core VM's 32 MB), so the weights stream from memory as in a decode
step: one row through every layer's weights in decode order ("layers"), the head, and each
shape alone through its 30 copies. The kernels are called through ctypes with the output
preallocated (no torch op per call). Packed fp32 and bf16 weights run twice: as packed
(engine/kernels/cpu/weight_memory.py: transparent huge pages where Linux gives them) and as
copies on the ordinary 4 KB pages of torch's allocator ("4k" rows). The reference is a plain
multi-threaded read of 512 MiB (a max-reduction, writing nothing; on 4 KB pages) and, as
before, a copy of the layers' bytes (its GB/s count the bytes read; it also writes, so it is
the lower figure). Every round times the read, the copy and each system in an order rotated
per round, after a warm-up round; figures are medians of --rounds. Each level runs in a child
process with DSPARK_CPU_ISA set (isa.py), with torch's thread count; on a shared machine the
rotation and medians keep a slow spell from landing on one system.

    python benchmarks/cpu_gemv.py --rows 1,4,16,64,256 [--baseline REV] [--rounds 3]

instead times each linear shape of the model at those row counts (prefill and batched decode),
at this process's DSPARK_CPU_ISA: fp32 on gemv.c's packing against quant_gemm.c's Q4_1 and Q8_0
on random blocks, and with --baseline, gemv.c and quant_gemm.c as git revision REV had them
(built from that revision's kernel sources, by build.py's command). Each shape streams 30 weights, as the
layers do (the LM head one), ms per call; every system runs once per round, interleaved in an
order rotated each round, after a warm-up round, and each figure is the best of --rounds rounds."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
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


def random_blocks(fmt: str, n: int, k: int) -> torch.Tensor:
    """A random [n, row_bytes] GGUF weight in `fmt`: fp16 scales (and Q4_1 minimums) of a
    trained model's magnitude, random quants."""
    from engine.kernels.cpu.quant_gemm import FORMATS

    blocks, row_bytes = n * k // 32, FORMATS[fmt].row_bytes(k)
    header = 2 if fmt == "Q8_0" else 4  # fp16 d (and m), then the quants
    raw = torch.randint(0, 256, (blocks, row_bytes * n // blocks), dtype=torch.uint8)
    raw[:, :header] = (torch.rand(blocks, header // 2) * 1e-2).to(torch.float16).view(torch.uint8)
    return raw.view(n, row_bytes)


SHAPE_NAMES = ["qkv", "o", "gate_up", "down"]
_LINEAR_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]  # fmt: skip


def plain_read_s(buffer: torch.Tensor) -> float:
    start = time.perf_counter()
    buffer.amax()
    return time.perf_counter() - start


def c_linear(function: Any, dtype: torch.dtype) -> Any:
    """gemv.c's or quant_gemm.c's linear_fn (kernel_signatures.h) on x [1, K] and a weight of
    n outputs, into a preallocated output: the kernel and its ctypes call, no torch op."""
    function.argtypes, function.restype = _LINEAR_ARGS, ctypes.c_int
    out = torch.empty(VOCAB, dtype=dtype)
    threads = torch.get_num_threads()

    def linear(x: torch.Tensor, w: torch.Tensor, n: int) -> None:
        k = x.shape[1]
        function(x.data_ptr(), k, w.data_ptr(), None, out.data_ptr(), n, 1, n, k, threads)

    return linear


def level_row(dtype: str, rounds: int) -> list[dict[str, Any]]:
    """GB/s (medians of `rounds`) of the GEMVs, the plain read and the copy, in this process
    (its DSPARK_CPU_ISA): one row per system. `dtype`: float32 or bfloat16 (gemv.c on packed
    weights, as packed and on 4 KB pages), or Q4_1 (quant_gemm.c on the embedded model's
    formats: Q4_1 layers, a Q8_0 head)."""
    from engine.kernels.cpu import build, gemv

    systems: dict[str, tuple[Any, list[torch.Tensor], torch.Tensor]] = {}  # linear, layer weights, head
    if dtype == "Q4_1":
        library = build.load("quant_gemm")
        assert library is not None, "no C compiler"
        q4, q8 = (c_linear(getattr(library, f"linear_{f}"), torch.float32) for f in ("q4_1", "q8_0"))
        layer_weights = [random_blocks("Q4_1", n, k) for _ in range(LAYERS) for n, k in LAYER_SHAPES]
        head = random_blocks("Q8_0", VOCAB, HIDDEN)
        systems["blocks"] = (q4, layer_weights, head)
        torch_dtype, head_linear = torch.float32, q8
    else:
        torch_dtype = getattr(torch, dtype)
        library = build.load("gemv")
        assert library is not None, "no C compiler"
        linear = c_linear(getattr(library, f"gemv_linear_{gemv.DTYPES[torch_dtype]}"), torch_dtype)
        packed = [gemv.pack(torch.randn(n, k).to(torch_dtype) * 0.02) for _ in range(LAYERS) for n, k in LAYER_SHAPES]
        head = gemv.pack(torch.randn(VOCAB, HIDDEN).to(torch_dtype) * 0.02)
        systems["packed"] = (linear, packed, head)
        systems["4k"] = (linear, [w.clone() for w in packed], head.clone())  # torch's allocator
        head_linear = linear
    inputs = {k: torch.randn(1, k).to(torch_dtype) for k in (576, 1536)}
    shapes = LAYER_SHAPES * LAYERS

    def nbytes(weights: list[torch.Tensor]) -> int:
        return sum(w.numel() * w.element_size() for w in weights)

    def run(system: str) -> dict[str, float]:
        """GB/s of one pass of each workload of `system`."""
        linear, weights, head_weight = systems[system]
        gbs = {}
        start = time.perf_counter()
        for w, (n, k) in zip(weights, shapes, strict=True):
            linear(inputs[k], w, n)
        gbs["layers"] = nbytes(weights) / (time.perf_counter() - start) / 1e9
        start = time.perf_counter()
        head_linear(inputs[HIDDEN], head_weight, VOCAB)
        gbs["head"] = nbytes([head_weight]) / (time.perf_counter() - start) / 1e9
        for index, (name, (n, k)) in enumerate(zip(SHAPE_NAMES, LAYER_SHAPES, strict=True)):
            alone = weights[index :: len(LAYER_SHAPES)]
            start = time.perf_counter()
            for w in alone:
                linear(inputs[k], w, n)
            gbs[name] = nbytes(alone) / (time.perf_counter() - start) / 1e9
        return gbs

    read_buffer = torch.ones(512 * 2**20 // 4)
    layer_bytes = nbytes(systems[next(iter(systems))][1])
    source = torch.empty(layer_bytes // 4)
    target = torch.empty_like(source)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    reads, copies = [], []
    order = list(systems)
    for round_index in range(rounds + 1):  # the first round warms up; each round rotates the order
        read_gbs = read_buffer.nbytes / plain_read_s(read_buffer) / 1e9
        copy_start = time.perf_counter()
        target.copy_(source)
        copy_gbs = layer_bytes / (time.perf_counter() - copy_start) / 1e9
        rotated = order[round_index % len(order) :] + order[: round_index % len(order)]
        timed = {name: run(name) for name in rotated}
        if round_index:
            reads.append(read_gbs)
            copies.append(copy_gbs)
            for name, workloads in timed.items():
                samples[name].append(workloads)
    read, copy = statistics.median(reads), statistics.median(copies)
    rows = []
    for name, runs in samples.items():
        row: dict[str, Any] = {"isa": gemv.isa_name(), "dtype": dtype, "pages": name}
        row.update({"threads": torch.get_num_threads(), "read_gb_s": read, "copy_gb_s": copy})
        for workload in ("layers", "head", *SHAPE_NAMES):
            gbs = statistics.median(r[workload] for r in runs)
            row[f"{workload}_gb_s"], row[f"{workload}_vs_read"] = gbs, gbs / read
        rows.append(row)
    return rows


def baseline_library(revision: str, directory: Path, name: str) -> ctypes.CDLL:
    """`name`.c (gemv or quant_gemm) of git `revision`, with the headers it had, built into
    `directory` by build.py's command for this process's ISA target."""
    from engine.kernels.cpu import build, isa

    folder = "engine/kernels/cpu"
    listing = ["git", "ls-tree", "--name-only", f"{revision}:{folder}"]
    for file in subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split():
        if file.endswith((".c", ".h")) and not (directory / file).exists():
            show = ["git", "show", f"{revision}:{folder}/{file}"]
            (directory / file).write_bytes(subprocess.run(show, cwd=ROOT, capture_output=True, check=True).stdout)
    compiler = build._compiler()
    assert compiler is not None, "no C compiler"
    output = directory / f"{name}_baseline.so"
    here, source = str(build.SOURCE_DIR), str(build.SOURCE_DIR / f"{name}.c")
    moved = {here: str(directory), source: str(directory / f"{name}.c")}
    command = build.compile_command(name, compiler, isa.target(), output)
    subprocess.run([moved.get(part, part) for part in command], check=True)
    return ctypes.CDLL(str(output))


def fp32_linear(function: Any) -> Any:
    """gemv.c's linear_f32 of a baseline on x [M, K] and a packed weight [N / 32, K, 32]."""
    function.argtypes, function.restype = _LINEAR_ARGS, ctypes.c_int

    def linear(x: torch.Tensor, packed: torch.Tensor) -> None:
        m, k, n = x.shape[0], x.shape[1], packed.shape[0] * packed.shape[2]
        out = torch.empty(m, n)
        function(x.data_ptr(), k, packed.data_ptr(), None, out.data_ptr(), n, m, n, k, torch.get_num_threads())

    return linear


def quantized_linear(function: Any) -> Any:
    """quant_gemm.c's linear_<fmt> (this tree's or a baseline's) on x [M, K] and blocks [N, *]."""
    function.argtypes, function.restype = _LINEAR_ARGS, ctypes.c_int

    def linear(x: torch.Tensor, w: torch.Tensor) -> None:
        m, k, n = x.shape[0], x.shape[1], w.shape[0]
        out = torch.empty(m, n)
        status = function(x.data_ptr(), k, w.data_ptr(), None, out.data_ptr(), n, m, n, k, torch.get_num_threads())
        assert status == 0

    return linear


def packed_copies(n: int, k: int, copies: int) -> list[torch.Tensor]:
    from engine.kernels.cpu import gemv

    return [gemv.pack(torch.randn(n, k) * 0.02) for _ in range(copies)]


def rows_table(row_counts: list[int], rounds: int, baseline: str | None) -> list[dict[str, Any]]:
    """ms per call of each layer shape and the LM head at each row count (module docstring)."""
    from engine.kernels.cpu import build, gemv

    libraries = {"": build.load("quant_gemm")}
    with tempfile.TemporaryDirectory() as scratch:
        fp32_before = None
        if baseline:
            libraries[" before"] = baseline_library(baseline, Path(scratch), "quant_gemm")
            fp32_before = fp32_linear(baseline_library(baseline, Path(scratch), "gemv").gemv_linear_f32)
        rows = []
        for n, k in [*LAYER_SHAPES, (VOCAB, HIDDEN)]:
            copies = 1 if n == VOCAB else LAYERS
            systems = {"fp32": (gemv.linear, packed_copies(n, k, copies))}
            if fp32_before is not None:  # its own copies, as below
                systems["fp32 before"] = (fp32_before, packed_copies(n, k, copies))
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
                if fp32_before is not None:
                    row["fp32 before / fp32"] = best["fp32 before"] / best["fp32"]
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
    parser.add_argument("--levels", help="comma-separated DSPARK_CPU_ISA levels (default: this CPU's and each below)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", help="comma-separated row counts: the per-shape table instead")
    parser.add_argument("--baseline", help="git revision whose gemv.c and quant_gemm.c the --rows table adds")
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
    levels = args.levels.split(",") if args.levels else ["native", *reversed(isa.levels_below_cpu())]
    for level in levels:
        for dtype in ("float32", "bfloat16", "Q4_1"):
            env = dict(os.environ, DSPARK_CPU_ISA=level)
            command = [sys.executable, __file__, "--child", dtype, "--rounds", str(args.rounds)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            rows += [{"level": level, **row} for row in json.loads(out.strip().splitlines()[-1])]
    print(f"GB/s, medians of {args.rounds} rounds; in brackets the share of the plain read")
    columns = ["level", "isa", "dtype", "pages", "threads", "read_gb_s", "copy_gb_s"]
    shares = ["layers", "head", *SHAPE_NAMES]
    print("| " + " | ".join(columns + shares) + " |")
    print("|" + "---|" * (len(columns) + len(shares)))
    for row in rows:
        cells = [f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        cells += [f"{row[f'{w}_gb_s']:.1f} ({100 * row[f'{w}_vs_read']:.0f} %)" for w in shares]
        print("| " + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
