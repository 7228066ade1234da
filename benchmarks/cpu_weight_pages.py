"""Batch-1 decode of the embedded SmolLM2 on CPU with its packed weights on transparent huge
pages (as the engine packs them, engine/kernels/cpu/weight_memory.py) against the same
weights copied onto torch's ordinary 4 KB pages, in one process, interleaved.

    python benchmarks/cpu_weight_pages.py [--dtype float32|bfloat16] [--rounds 8]
        [--new-tokens 64] [--out results.json]

Both engines run the same kernels on the same values (the 4 KB copy is made after packing and
before the engine is built, so its one-call decoder stack reads the copies). Each round
measures a plain multi-threaded read (a max-reduction of 512 MiB, 4 KB pages), then decodes
one chat prompt greedily on each engine, in an order that alternates per round, after one
untimed prompt each. Decode-only tokens/s (from the first token to the last) and the weight
stream they imply (the model's weight bytes per token x tokens/s) are medians over rounds, the
stream also as a share of the median plain read."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_peer_systems import model_weight_bytes, plain_read_gbs  # noqa: E402
from benchmarks.smollm2_offline import build_engine_parts, load_model, prompts_for, run_engine  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.kernels.cpu.linear import is_packed, pack_module_weights  # noqa: E402

MODEL = "smollm2-135m"


def move_packed_to_small_pages(model: nn.Module) -> None:
    """Replace every packed weight of `model` by a copy from torch's allocator (4 KB pages where
    transparent huge pages are `madvise`), keeping tied modules tied."""
    copies: dict[int, nn.Parameter] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and is_packed(weight):
            if id(weight) not in copies:
                copies[id(weight)] = nn.Parameter(weight.detach().clone(), requires_grad=False)
            module.weight = copies[id(weight)]


def engine(dtype: str, small_pages: bool) -> tuple[EngineCore, Any]:
    loaded = load_model(MODEL, dtype=getattr(torch, dtype), device="cpu", progress=False, quantized=False)
    if small_pages:
        pack_module_weights(loaded.model, getattr(torch, dtype))
        move_packed_to_small_pages(loaded.model)
    config = EngineConfig(
        model=MODEL, device="cpu", dtype=dtype, max_num_seqs=1, max_model_len=2048, enable_prefix_cache=False
    )
    return EngineCore(config, parts=build_engine_parts(config, loaded=loaded)), loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    engines = {"huge pages": engine(args.dtype, False), "4 KB pages": engine(args.dtype, True)}
    loaded = next(iter(engines.values()))[1]
    weight_bytes = model_weight_bytes(next(iter(engines.values()))[0].runner.model)
    prompts = prompts_for(loaded.tokenizer, args.rounds)
    for core, _ in engines.values():
        run_engine(core, [prompts[0]], args.new_tokens)  # untimed
    rates: dict[str, list[float]] = {name: [] for name in engines}
    reads = []
    for round_index in range(args.rounds):
        reads.append(plain_read_gbs(512, repeats=3))
        names = list(engines) if round_index % 2 == 0 else list(reversed(engines))
        for name in names:
            timing = run_engine(engines[name][0], [prompts[round_index]], args.new_tokens)
            rates[name].append(timing.decode_tokens / timing.decode_seconds)
    read = statistics.median(reads)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "dtype": args.dtype, "threads": torch.get_num_threads(),
        "weight_bytes": weight_bytes, "plain_read_gbs": read, "rounds": args.rounds, "systems": {},
    }  # fmt: skip
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {weight_bytes / 1e6:.0f} MB of weights a token")
    print(f"plain read: median {read:.1f} GB/s of {args.rounds} rounds")
    print("| weights on | decode tok/s (median; min-max) | weight stream GB/s (share of the plain read) |")
    print("|---|---:|---:|")
    for name, values in rates.items():
        tok_s = statistics.median(values)
        stream = tok_s * weight_bytes / 1e9
        result["systems"][name] = {"decode_tok_s": values, "median_tok_s": tok_s, "stream_gbs": stream}
        spread = f"{min(values):.1f}-{max(values):.1f}"
        print(f"| {name} | {tok_s:.1f} ({spread}) | {stream:.1f} ({100 * stream / read:.0f} %) |")
    huge, small = (rates[name] for name in engines)
    print("huge / 4 KB per round:", " ".join(f"{a / b:.2f}" for a, b in zip(huge, small, strict=True)))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
