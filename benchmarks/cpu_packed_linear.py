"""Packed against dense linear weights on CPU, side by side in one run (packed: for the AMX
tile kernel where the CPU has it, else for oneDNN; see engine/kernels/cpu/linear.py, and
benchmarks/cpu_kernels.py for the two packings against each other):

1. GEMMs alone: SmolLM2-135M's 120 layer weights (qkv, o, gate_up, down per layer) and its
   LM head, one call each in turn so that weights stream from DRAM as in a decode step, at
   1, 8 and 16 rows; bf16 and float32; best of 5.
2. The engine's decode step (the embedded SmolLM2, bf16), a dense and a packed copy of the
   model in one process, stepped alternately; median step time at batch 1 (plain and
   DSpark) and 16.

    .venv/bin/python benchmarks/cpu_packed_linear.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # smollm2_offline, for its prompts

from smollm2_offline import prompts_for  # noqa: E402

import engine.engine_setup as engine_setup  # noqa: E402
from engine.config import EngineConfig, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.kernels.cpu.linear import cpu_packing_supported, linear, pack_weight  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.loader.resolve import shipped_drafter  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

# SmolLM2-135M: hidden 576, 9 q / 3 kv heads of 64, MLP 1536, 30 layers, vocab 49152.
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LM_HEAD = (49152, 576)


def gemm_ms(weights: list[torch.Tensor], rows: int, dtype: torch.dtype) -> float:
    inputs = {k: torch.randn(rows, k, dtype=dtype) for k in {w.shape[1] for w in weights}}
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for w in weights:
            linear(inputs[w.shape[1]], w)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def gemm_table() -> None:
    print("| dtype | rows | dense ms | packed ms | dense / packed |\n|---|---:|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        dense = [torch.randn(*shape).to(dtype) for _ in range(30) for shape in LAYER_SHAPES]
        dense.append(torch.randn(*LM_HEAD).to(dtype))
        packed = [pack_weight(w) for w in dense]  # float32 too, to compare
        for rows in (1, 8, 16):
            x = torch.randn(rows, 576, dtype=dtype)
            if dtype == torch.bfloat16:  # oneDNN: bit for bit; the tile kernel: to bf16 rounding
                torch.testing.assert_close(linear(x, packed[0]), F.linear(x, dense[0]), rtol=2**-7, atol=1e-2)
            d, p = gemm_ms(dense, rows, dtype), gemm_ms(packed, rows, dtype)
            print(f"| {str(dtype).removeprefix('torch.')} | {rows} | {d:.1f} | {p:.1f} | {d / p:.2f} |", flush=True)


def engine_table() -> None:
    copies = {
        kind: load_model("smollm2-135m", dtype=torch.bfloat16, device="cpu", progress=False)
        for kind in ("dense", "packed")
    }
    pack = engine_setup.pack_module_weights
    keep_dense: Callable[[torch.nn.Module, torch.dtype], int] = lambda model, dtype: 0  # noqa: E731

    def make(kind: str, batch: int, speculative: bool) -> EngineCore:
        engine_setup.pack_module_weights = pack if kind == "packed" else keep_dense  # type: ignore[assignment]
        spec = SpeculativeConfig(drafter=str(shipped_drafter("smollm2-135m"))) if speculative else None
        config = EngineConfig(
            model="smollm2-135m",
            device="cpu",
            dtype="bfloat16",
            max_num_seqs=batch,
            max_model_len=2048,
            enable_prefix_cache=False,
            speculative=spec,
        )
        engine = EngineCore(config, parts=engine_setup.build_engine_parts(config, loaded=copies[kind]))
        engine_setup.pack_module_weights = pack
        for i, prompt in enumerate(prompts_for(copies[kind].tokenizer, batch)):
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True))
        for _ in range(3):  # prefill and the first decode steps
            engine.step()
        return engine

    print("\n| engine step (bf16) | dense ms | packed ms | dense / packed |\n|---|---:|---:|---:|")
    for batch, speculative in ((1, False), (1, True), (16, False)):
        engines = {kind: make(kind, batch, speculative) for kind in copies}
        times: dict[str, list[float]] = {kind: [] for kind in engines}
        for _ in range(8):
            for kind, engine in engines.items():
                for _ in range(3):
                    start = time.perf_counter()
                    engine.step()
                    times[kind].append(time.perf_counter() - start)
        dense, packed = (statistics.median(times[k]) * 1e3 for k in ("dense", "packed"))
        name = f"batch {batch}" + (", DSpark" if speculative else "")
        print(f"| {name} | {dense:.1f} | {packed:.1f} | {dense / packed:.2f} |", flush=True)


def main() -> None:
    if not cpu_packing_supported(torch.bfloat16):
        raise SystemExit("this CPU or torch build cannot pack bf16 weights for oneDNN")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    gemm_table()
    engine_table()


if __name__ == "__main__":
    main()
