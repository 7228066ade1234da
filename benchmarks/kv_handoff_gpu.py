"""Device-to-device KV hand-off between two processes on one GPU, against a plain device copy
of the same bytes and against the host round trip the object-store transport makes, and an
8k-token prompt's first and second token P/D against colocated (random weights in a
Llama-3-8B shape: speed does not depend on weight values).

    python benchmarks/kv_handoff_gpu.py [--prompt-tokens 8128] [--rounds 5] [--out results.json]

A child process (the prefill worker) prefills the prompt, holds its slots and sends a
`CudaIpcTransfer` ticket; this process (the decode worker) copies the slots out of the
child's pools (`copy_out`: map, gather on a side stream, wait) and decodes. Per round:
- hand-off GB/s: the KV's bytes over `copy_out`'s wall time (the first round also maps the
  pools once; it is reported apart);
- plain copy GB/s: one `copy_` of a tensor of the same bytes on this GPU (bytes read);
- the gather alone: `KVPool.read` of as many slots on this process's own pool (what
  `copy_out` spends on the device, without the ticket check, the mapping and the release);
- host round trip: gather to host memory and back (`KVPool.read(...).cpu()`, then `.to()`),
  what the object store's path costs before any network;
- TTFT: submission to the first token on the prefill engine (P/D) and on one engine
  (colocated); first to second token: P/D adds the ticket, the copy and one decode step.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.sampling_params import SamplingParams  # noqa: E402

KV_BYTES = 6 << 30


@dataclass(frozen=True)
class QueueReleaseSink:
    queue: Any  # a multiprocessing.Manager queue proxy

    def release(self, request_id: str) -> None:
        self.queue.put(request_id)


def build_engine(prompt_tokens: int) -> Any:
    from engine_gpu import LLAMA3_8B, engine_for, random_model, word_tokenizer

    from engine.loader.load import LoadedModel
    from engine.loader.resolve import ModelSource

    loaded = LoadedModel(
        random_model(LLAMA3_8B, torch.bfloat16),
        LLAMA3_8B,
        word_tokenizer(LLAMA3_8B.vocab_size),
        ModelSource(name="llama3-8b-shaped", kind="hf", path=Path(".")),
    )
    return engine_for(
        loaded,
        max_num_seqs=4,
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=LLAMA3_8B.max_position,
        max_num_batched_tokens=prompt_tokens,
    )


def prompt(round_index: int, tokens: int) -> list[int]:
    gen = torch.Generator().manual_seed(round_index)
    return torch.randint(3, 60000, (tokens,), generator=gen).tolist()


def first_token(engine: Any, request_id: str, ids: list[int], prefill_only: bool) -> float:
    """Seconds from submission to the first token."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, ids, params, prefill_only=prefill_only)
    while True:
        for out in engine.step():
            if out.request_id == request_id and out.token_ids:
                return time.perf_counter() - start


def producer_main(prompt_tokens: int, rounds: int, tickets: Any, releases: Any, go: Any) -> None:
    from services.workers.device_transfer import CudaIpcTransfer

    engine = build_engine(prompt_tokens)
    transfer = CudaIpcTransfer(hold_s=120.0)
    transfer.bind(engine.kv_pools(), QueueReleaseSink(releases))
    for r in range(rounds + 1):  # round 0 warms up
        go.get()
        ids = prompt(r, prompt_tokens)
        ttft = first_token(engine, f"r{r}", ids, prefill_only=True)
        while engine.requests[f"r{r}"].inflight_steps:
            engine.step()
        held = engine.hold_kv(f"r{r}", transfer.hold_s)
        tickets.put((ttft, time.perf_counter(), transfer.send_held(f"r{r}", held, 0)))
        engine.release_held(releases.get(timeout=120))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=8128, help="8k: the 8,192-token context less 64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from services.workers.device_transfer import CudaIpcTransfer

    ctx = mp.get_context("spawn")
    rows = []
    with ctx.Manager() as manager:
        tickets, releases, go = manager.Queue(), manager.Queue(), manager.Queue()
        child = ctx.Process(target=producer_main, args=(args.prompt_tokens, args.rounds, tickets, releases, go))
        child.start()
        engine = build_engine(args.prompt_tokens)
        receiver = CudaIpcTransfer()
        for r in range(args.rounds + 1):
            go.put(r)
            ttft_pd, sent_s, ticket = tickets.get(timeout=300)
            t0 = time.perf_counter()
            handoff = receiver.copy_out(ticket)
            copied_at = time.perf_counter()
            copy_s = copied_at - t0
            nbytes = handoff.target_kv.numel() * handoff.target_kv.element_size()
            engine.add_decode_request(f"d{r}", handoff)
            second_pd = None  # perf_counter is the host's monotonic clock: both processes share it
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.request_id == f"d{r}" and len(out.token_ids) >= 2 and second_pd is None:
                        second_pd = time.perf_counter() - sent_s
            # a plain device copy of the same bytes, and the host round trip, on this GPU
            flat = handoff.target_kv.reshape(-1)
            dst = torch.empty_like(flat)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            dst.copy_(flat)
            torch.cuda.synchronize()
            plain_s = time.perf_counter() - t1
            t2 = time.perf_counter()
            back = handoff.target_kv.cpu().to(flat.device)
            torch.cuda.synchronize()
            host_s = time.perf_counter() - t2
            # the gather alone (two indexed reads and the stack that interleaves K and V, as
            # copy_out runs it) on this engine's own pool, same slot count
            pool = engine.runner.kv_pool
            index = torch.randperm(pool.k.shape[1] - 1, device=flat.device)[: handoff.target_kv.shape[2]]
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            pool.read(index)
            torch.cuda.synchronize()
            gather_s = time.perf_counter() - t4
            del handoff, flat, dst, back
            # colocated: a prompt of the same length prefilled and decoded by one engine (not the
            # handed-off one: its pages are in this engine's prefix cache now)
            fresh = prompt(args.rounds + 1 + r, args.prompt_tokens)
            ttft_co = first_token(engine, f"c{r}", fresh, prefill_only=False)
            t3 = time.perf_counter()
            second_co = None
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.request_id == f"c{r}" and len(out.token_ids) >= 2 and second_co is None:
                        second_co = time.perf_counter() - t3
            row = {
                "round": r,
                "kv_bytes": nbytes,
                "handoff_gb_per_s": nbytes / copy_s / 1e9,
                "copy_out_ms": 1e3 * copy_s,
                "gather_alone_ms": 1e3 * gather_s,
                "plain_copy_gb_per_s": nbytes / plain_s / 1e9,
                "host_round_trip_gb_per_s": nbytes / host_s / 1e9,
                "ticket_to_copied_ms": 1e3 * (copied_at - sent_s),
                "ttft_pd_ms": 1e3 * ttft_pd,
                "ttft_colocated_ms": 1e3 * ttft_co,
                "pd_first_to_second_token_ms": 1e3 * (second_pd or float("nan")),
                "colocated_first_to_second_token_ms": 1e3 * (second_co or float("nan")),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        child.join(timeout=60)
    steady = rows[1:]
    summary = {k: statistics.median(r[k] for r in steady) for k in steady[0] if k not in ("round", "kv_bytes")}
    print(f"KV of a {args.prompt_tokens}-token prompt: {rows[0]['kv_bytes'] / 1e9:.2f} GB (target pool, bf16)")
    print("| measure (median of rounds 1..) | value |")
    print("|---|---:|")
    for key, value in summary.items():
        print(f"| {key} | {value:.2f} |")
    print(f"| first round's hand-off (maps the pools) GB/s | {rows[0]['handoff_gb_per_s']:.2f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "median": summary}))


if __name__ == "__main__":
    main()
