"""One layer's attention of an agentic step, with and without the shared pass, and the shared
pass's launch shapes: microseconds per call on the GPU, side by side in one run.

    python benchmarks/cascade_kernels.py [--shared 2048] [--iters 30] [--out results.json]

Llama-3-8B attention (32 query heads, 8 kv heads, head dim 128, bf16, pages of 16). Every
request's context starts with the same `shared` keys (one set of pages, as the prefix cache
holds a system prompt), then keys of its own (200-700, seeded). Forwards, as the engine
builds them (engine/runner/batch_inputs.py):
- decode: 154 requests, one row each (the decode rows of 256 agentic sessions);
- verify: 64 requests, a DSpark window of 8 rows each;
- mixed: the 154 decode rows, then 3 chunks of 143 tokens (a mixed step's token mix).
Per forward: the Triton backend without the shared pass (`own-keys`), with it at the default
launch shape (`cascade`), and the whole cascade at each launch shape of the shared pass in
SHAPES (tiles, warps, stages, key splits). For the forwards whose own pass is the split-KV
kernel (decode, verify), that pass alone at each launch shape in OWN_SHAPES, folding
shared partials that stand for no keys (its cost does not depend on their values).
Two sweeps follow:
- verify windows of VERIFY_WIDTHS rows for VERIFY_BATCHES requests, `own-keys` against
  `cascade`: where the shared pass stops paying for DSpark verify forwards;
- plain decode without a shared prefix (batch 1 and beyond, contexts of DECODE_CONTEXTS
  keys), the split-KV kernel at each of DECODE_BLOCK_N keys per tile and its default splits.
Each variant: `iters` calls replayed from a CUDA graph (time_us); the backend variants include
the KV store.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from engine.kernels.attention_metadata import AttentionMetadata  # noqa: E402
from engine.kernels.triton import shared_prefix_attention  # noqa: E402
from engine.kernels.triton.decode_attention import (  # noqa: E402
    MAX_ROWS,
    decode_attention,
    own_keys_launches,
    split_kv_rows,
)
from engine.kernels.triton.shared_prefix_attention import SharedTiles  # noqa: E402
from engine.runner.batch_inputs import ExtendInputs, concat_extend, expand_extend, uniform_window  # noqa: E402
from engine.runner.shared_prefix_rows import find_shared_prefix  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
SHAPES = [SharedTiles(m, n, w, s, splits) for m, n, w, s, splits in
          [(64, 64, 4, 2, None), (64, 64, 4, 3, None), (128, 64, 8, 2, None), (128, 64, 8, 3, None),
           (128, 128, 8, 2, None), (128, 64, 4, 3, None), (64, 128, 4, 2, None), (128, 32, 4, 2, None),
           (128, 64, 8, 2, 1), (128, 64, 8, 2, 4), (128, 64, 8, 2, 8), (256, 64, 8, 2, None),
           (128, 128, 8, 3, 4)]]  # fmt: skip
# (splits, keys per tile, pipeline stages) of the own pass
OWN_SHAPES = [(splits, n, 2) for splits in (1, 2, 4) for n in (32, 64, 128)] + [(1, 64, 3), (1, 32, 3), (2, 64, 3)]
SHARED_SPLITS_FOLDED = 2  # shared partials the own pass folds in, as the default launch makes at 2k
VERIFY_REQUESTS = 64  # the verify forward's
VERIFY_BATCHES = (16, 64, 154)
VERIFY_WIDTHS = (2, 4, 8)
DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXTS = (2048, 8192)
DECODE_BLOCK_N = (32, 64, 128)


@dataclasses.dataclass
class Forward:
    name: str
    inputs: ExtendInputs  # without the shared keys
    table: np.ndarray  # host mirror of req_to_token
    rows: np.ndarray
    visible: np.ndarray  # keys each request sees before its rows


def build(shared: int, seed: int, device: torch.device) -> tuple[list[Forward], torch.Tensor, torch.Tensor]:
    """The forwards of the docstring, the verify sweep's among them; every request's pages
    are its own after the shared ones."""
    rng = np.random.default_rng(seed)
    own = {"decode": rng.integers(200, 700, 154), "chunks": rng.integers(0, 600, 3)}
    for batch in sorted({VERIFY_REQUESTS, *VERIFY_BATCHES}):
        own[f"verify{batch}"] = rng.integers(200, 700, batch)
    total_own = sum(int(x.sum()) + (PAGE + 200) * len(x) for x in own.values())
    num_pages = shared // PAGE + total_own // PAGE + 8 * len(own)
    table = np.full((sum(len(x) for x in own.values()) + 1, 8192), -1, dtype=np.int32)
    next_page = shared // PAGE
    shared_slots = np.arange(shared, dtype=np.int32)
    row = 0
    forwards_rows: dict[str, list[int]] = {}
    for kind, lens in own.items():
        forwards_rows[kind] = []
        for n in lens:
            need = int(n) + 200  # room for the forward's own rows
            pages = -(-need // PAGE)
            slots = (np.arange(next_page, next_page + pages)[:, None] * PAGE + np.arange(PAGE)).reshape(-1)
            next_page += pages
            table[row, : shared + len(slots)] = np.concatenate((shared_slots, slots.astype(np.int32)))
            forwards_rows[kind].append(row)
            row += 1
    assert next_page <= num_pages
    req_to_token = torch.from_numpy(table).to(device)
    k_cache = torch.randn(num_pages * PAGE + 1, HKV, D, dtype=torch.bfloat16, device=device)
    v_cache = torch.randn_like(k_cache)

    def window(name: str, kind: str, width: int) -> Forward:
        rows = np.array(forwards_rows[kind])
        starts = shared + own[kind].astype(np.int32)
        inputs = uniform_window(
            req_to_token, torch.from_numpy(rows).to(device), torch.from_numpy(starts).to(device), width,
            int(starts.max()) + width, causal=True,
        )  # fmt: skip
        return Forward(name, inputs, table, rows, starts)

    decode = window("decode", "decode", 1)
    verify = window("verify", f"verify{VERIFY_REQUESTS}", 8)
    chunk_rows = np.array(forwards_rows["chunks"])
    chunk_starts = (shared + own["chunks"]).astype(np.int32)
    chunks = expand_extend(req_to_token, chunk_rows, chunk_starts, np.full(3, 143, dtype=np.int32), device)
    mixed = Forward(
        "mixed",
        concat_extend(decode.inputs, chunks),
        table,
        np.concatenate((decode.rows, chunk_rows)),
        np.concatenate((decode.visible, chunk_starts)),
    )
    sweep = [
        window(f"verify {batch}x{width}", f"verify{batch}", width)
        for batch in VERIFY_BATCHES
        for width in VERIFY_WIDTHS
    ]
    return [decode, verify, mixed, *sweep], k_cache, v_cache


def plain_decode(
    batch: int, context: int, device: torch.device
) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
    """Decode rows of `batch` requests over `context` keys each, no prefix shared: the
    metadata and a KV cache of just those pages."""
    slots = torch.arange(batch * context, dtype=torch.int32, device=device).view(batch, context)
    rows = torch.arange(batch, device=device)
    starts = torch.full((batch,), context - 1, dtype=torch.int32, device=device)
    meta = uniform_window(slots, rows, starts, 1, context, causal=True).meta
    k_cache = torch.randn(batch * context + 1, HKV, D, dtype=torch.bfloat16, device=device)
    return meta, k_cache, torch.randn_like(k_cache)


def measure_decode_tiles(batch: int, context: int, iters: int, device: torch.device) -> list[dict[str, object]]:
    """The split-KV kernel without a shared prefix at each of DECODE_BLOCK_N keys per tile."""
    meta, k_cache, v_cache = plain_decode(batch, context, device)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=device)
    out = torch.empty_like(q)
    reference = decode_attention(q, k_cache, v_cache, meta, 0.088, torch.empty_like(q)).float()
    rows = []
    for block_n in DECODE_BLOCK_N:

        def run(block_n: int = block_n) -> torch.Tensor:
            return decode_attention(q, k_cache, v_cache, meta, 0.088, out, block_n=block_n)

        error = (run().float() - reference).abs().max().item()
        us = time_us(run, iters)
        name = f"plain decode {batch}x{context}"
        rows.append(
            {"forward": name, "tokens": batch, "variant": f"split-KV n{block_n}", "us": us, "max_abs_error": error}
        )
        print(f"{name:24s} split-KV n{block_n:<4d} {us:8.1f} us  max |diff| {error:.4f}", flush=True)
    return rows


def with_shared(forward: Forward, device: torch.device) -> AttentionMetadata:
    found = find_shared_prefix(forward.table, forward.rows, forward.visible, PAGE)
    assert found is not None, "the forward's requests share their first pages"
    shared = found.to_device(device, found.length)
    meta = forward.inputs.meta
    if meta.parts is None:
        return dataclasses.replace(meta, shared=shared)
    first, second = meta.parts
    parts = (
        dataclasses.replace(first, shared=shared.rows(0, first.batch_size)),
        dataclasses.replace(second, shared=shared.rows(first.batch_size, meta.batch_size)),
    )
    return dataclasses.replace(meta, shared=shared, parts=parts)


def time_us(fn: Callable[[], torch.Tensor], iters: int) -> float:
    """Microseconds per call of `fn` on the device: `iters` calls captured in one CUDA graph
    after a warm-up (compilation), then the graph replayed between two events. Calls launched
    from Python one by one would time the host's launch rate wherever a call's kernels take
    less than their launches (small batches: tens of microseconds); the engine replays graphs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()  # the first replay uploads the graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / iters


def measure(
    forward: Forward, k_cache: torch.Tensor, v_cache: torch.Tensor, iters: int, sweep: bool
) -> list[dict[str, object]]:
    """Every variant of the docstring for one forward; `sweep`: only own-keys and cascade."""
    device = k_cache.device
    backend = TritonAttentionBackend()
    plain = forward.inputs.meta
    cascade = with_shared(forward, device)
    n = plain.num_tokens
    q = torch.randn(n, HQ, D, dtype=torch.bfloat16, device=device)
    k = torch.randn(n, HKV, D, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    out = torch.empty_like(q)

    def through_backend(meta: AttentionMetadata) -> Callable[[], torch.Tensor]:
        return lambda: backend.forward(q, k, v, k_cache, v_cache, meta, 0.088, out=out)

    def shared_pass_as(tiles: SharedTiles) -> Callable[[], torch.Tensor]:
        return lambda: shared_prefix_attention.cascade_attention(q, k_cache, v_cache, cascade, 0.088, out, tiles=tiles)

    def own_pass_as(splits: int, block_n: int, num_stages: int) -> Callable[[], torch.Tensor]:
        total = SHARED_SPLITS_FOLDED + (splits if splits > 1 else 0)
        partial_o = torch.zeros(n, HQ, total, D, dtype=torch.float32, device=device)
        partial_lse = torch.full((n, HQ, total), float("-inf"), dtype=torch.float32, device=device)

        launches = own_keys_launches(
            q, HKV, cascade, 0.088, out, partial_o, partial_lse, SHARED_SPLITS_FOLDED, splits, block_n, num_stages
        )

        def run() -> torch.Tensor:
            for launch in launches:
                launch(k_cache, v_cache)
            return out

        return run

    variants = {"own-keys": through_backend(plain), "cascade": through_backend(cascade)}
    for tiles in () if sweep else SHAPES:
        label = f"cascade, shared {tiles.block_m}x{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}"
        variants[f"{label} splits {tiles.num_splits or 'auto'}"] = shared_pass_as(tiles)
    own_only = set()
    if not sweep and cascade.parts is None and split_kv_rows(cascade, HQ // HKV) <= MAX_ROWS:
        for splits, block_n, num_stages in OWN_SHAPES:
            label = f"own pass alone, splits {splits} n{block_n} s{num_stages}"
            variants[label] = own_pass_as(splits, block_n, num_stages)
            own_only.add(label)
    reference = backend.forward(q, k, v, k_cache, v_cache, plain, 0.088).float()
    rows = []
    for label, fn in variants.items():
        result = fn().float()
        error = float("nan") if label in own_only else (result - reference).abs().max().item()
        us = time_us(fn, iters)
        rows.append({"forward": forward.name, "tokens": n, "variant": label, "us": us, "max_abs_error": error})
        print(f"{forward.name:14s} T={n:4d} {label:52s} {us:8.1f} us  max |diff| {error:.4f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    forwards, k_cache, v_cache = build(args.shared, seed=0, device=device)
    rows = [
        row
        for forward in forwards
        for row in measure(forward, k_cache, v_cache, args.iters, sweep=forward.name.startswith("verify "))
    ]
    del k_cache, v_cache
    for batch in DECODE_BATCHES:
        for context in DECODE_CONTEXTS:
            rows += measure_decode_tiles(batch, context, args.iters, device)
            torch.cuda.empty_cache()
    if args.out is not None:
        meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
