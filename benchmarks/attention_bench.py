"""Attention backends at real model shapes: correctness, then Triton vs torch timings.

    python benchmarks/attention_bench.py                  # Llama-3-8B shapes, bf16, H200 defaults
    python benchmarks/attention_bench.py --dry-run        # print the plan (any machine)

For each case (decode at batch x context, a DSpark verify window, prefill, chunked-prefill
extend) it builds a shuffled paged slot table (page size 16) and checks the Triton backend
against the torch backend run in float32, then times one attention forward (store + attend)
of each backend with `triton.testing.do_bench` (median, L2 flushed between runs), and the
Triton forward replayed in a CUDA graph as the engine runs decode (`do_bench_cudagraph`).
Bandwidth is the K/V bytes a forward must read (every request's keys and values, once)
divided by the time, next to the device's measured copy bandwidth (read + write).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.attention_metadata import AttentionMetadata  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class BenchCase:
    kind: str  # decode | verify | prefill | extend
    batch: int
    context: int  # keys already cached per request
    extend: int  # new rows per request
    causal: bool = True

    @property
    def label(self) -> str:
        return f"{self.kind} B={self.batch} ctx={self.context} n={self.extend}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--batches", type=_ints, default=[1, 16, 64, 256], help="decode batch sizes")
    p.add_argument("--contexts", type=_ints, default=[1024, 4096], help="decode context lengths")
    p.add_argument("--verify-window", type=int, default=8, help="DSpark W = gamma + 1; 0 skips")
    p.add_argument("--verify-batches", type=_ints, default=[1, 16, 64])
    p.add_argument("--verify-context", type=int, default=4096)
    p.add_argument("--prefill", type=int, default=4096, help="prompt length of the prefill case; 0 skips")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time")
    p.add_argument("--no-check", action="store_true", help="skip the float32 torch comparison")
    p.add_argument("--no-torch", action="store_true", help="time the Triton backend only")
    p.add_argument("--dry-run", action="store_true", help="print the cases and exit")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def plan(args: argparse.Namespace) -> list[BenchCase]:
    cases = [BenchCase("decode", b, ctx, 1) for ctx in args.contexts for b in args.batches]
    if args.verify_window:
        window, context = args.verify_window, args.verify_context
        cases += [BenchCase("verify", b, context, window) for b in args.verify_batches]
    if args.prefill:
        cases.append(BenchCase("prefill", 1, 0, args.prefill))
        cases.append(BenchCase("extend", 1, args.prefill // 2, args.prefill // 2))  # a chunked prefill step
    return cases


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float


def build(case: BenchCase, args: argparse.Namespace, device: torch.device) -> Inputs:
    """Equal-length requests on a shuffled page pool (every page owned by one request)."""
    dtype = DTYPES[args.dtype]
    page = args.page_size
    seq = case.context + case.extend
    pages_per_req = math.ceil(seq / page)
    num_slots = case.batch * pages_per_req * page
    page_ids = torch.randperm(case.batch * pages_per_req, device=device).view(case.batch, pages_per_req)
    offsets = torch.arange(page, device=device)
    req_to_token = (page_ids[:, :, None] * page + offsets).reshape(case.batch, -1)[:, :seq].to(torch.int32)
    shape = (num_slots + 1, args.kv_heads, args.head_dim)
    k_cache = torch.randn(shape, device=device, dtype=dtype)
    v_cache = torch.randn(shape, device=device, dtype=dtype)
    num_tokens = case.batch * case.extend
    q = torch.randn(num_tokens, args.q_heads, args.head_dim, device=device, dtype=dtype)
    k = torch.randn(num_tokens, args.kv_heads, args.head_dim, device=device, dtype=dtype)
    v = torch.randn(num_tokens, args.kv_heads, args.head_dim, device=device, dtype=dtype)
    token_req = torch.arange(case.batch, device=device).repeat_interleave(case.extend, output_size=num_tokens)
    token_offset = torch.arange(case.extend, device=device).repeat(case.batch)
    out_slots = req_to_token[token_req, case.context + token_offset].long()
    full = lambda value: torch.full((case.batch,), value, dtype=torch.int32, device=device)
    meta = AttentionMetadata(
        req_to_token=req_to_token,
        req_rows=torch.arange(case.batch, device=device),
        seq_lens=full(seq),
        extend_lens=full(case.extend),
        q_start=torch.arange(case.batch, device=device, dtype=torch.int32) * case.extend,
        out_slots=out_slots,
        token_req=token_req,
        token_offset=token_offset,
        num_tokens=num_tokens,
        max_extend_len=case.extend,
        max_seq_len=seq,
        causal=case.causal,
        # decode/verify come laid out [B, n] from the runner; prefill takes the ragged path
        uniform_extend=case.extend if case.kind in ("decode", "verify") else None,
    )
    return Inputs(q, k, v, k_cache, v_cache, meta, 1.0 / math.sqrt(args.head_dim))


def kv_bytes(case: BenchCase, args: argparse.Namespace) -> int:
    elt = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    return 2 * case.batch * (case.context + case.extend) * args.kv_heads * args.head_dim * elt


def attention_flops(case: BenchCase, args: argparse.Namespace) -> float:
    """2 matmuls x 2 flop per multiply-add over every (query, visible key) pair."""
    visible = case.extend * case.context + case.extend * (case.extend + 1) / 2
    return 4.0 * case.batch * visible * args.q_heads * args.head_dim


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a 1 GiB device-to-device copy, counting read + write."""
    import triton.testing

    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = plan(args)
    print(
        f"attention bench: Hq={args.q_heads} Hkv={args.kv_heads} D={args.head_dim} {args.dtype} "
        f"page={args.page_size}, {len(cases)} cases"
    )
    if args.dry_run:
        for case in cases:
            print(f"  {case.label}: K/V {kv_bytes(case, args) / 2**20:.1f} MiB")
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA/ROCm GPU (use --dry-run to see the plan)", file=sys.stderr)
        return 2

    import triton.testing

    from engine.attention.torch_backend import TorchAttentionBackend
    from engine.attention.triton_backend import TritonAttentionBackend

    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    print(f"device: {name}, torch {torch.__version__}, triton {triton.__version__}")
    copy_bw = copy_bandwidth(device)
    print(f"device copy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s")
    triton_backend, torch_backend = TritonAttentionBackend(), TorchAttentionBackend()

    rows = []
    failures = 0
    for case in cases:
        x = build(case, args, device)
        out = torch.empty_like(x.q)

        def run_triton(x=x, out=out):
            return triton_backend.forward(x.q, x.k, x.v, x.k_cache, x.v_cache, x.meta, x.scale, out=out)

        def run_torch(x=x):
            return torch_backend.forward(x.q, x.k, x.v, x.k_cache, x.v_cache, x.meta, x.scale)

        err = float("nan")
        if not args.no_check:
            got = run_triton().float()
            ref = torch_backend.forward(
                x.q.float(), x.k.float(), x.v.float(), x.k_cache.float(), x.v_cache.float(), x.meta, x.scale
            )
            err = (got - ref).abs().max().item()
            ok = bool(torch.isfinite(got).all()) and err < (2e-2 if args.dtype != "fp32" else 1e-4)
            failures += not ok
            del got, ref
        triton_ms = triton.testing.do_bench(run_triton, rep=args.rep_ms, return_mode="median")
        graph_ms = triton.testing.do_bench_cudagraph(run_triton, rep=args.rep_ms, return_mode="median")
        torch_ms = float("nan")
        if not args.no_torch:
            torch_ms = triton.testing.do_bench(run_torch, rep=args.rep_ms, return_mode="median")
        kv_bw = kv_bytes(case, args) / (triton_ms * 1e-3)
        tflops = attention_flops(case, args) / (triton_ms * 1e-3) / 1e12
        rows.append((case, triton_ms, graph_ms, torch_ms, kv_bw, tflops, err))
        print(
            f"{case.label:<32} triton {triton_ms * 1e3:9.1f} us (graph {graph_ms * 1e3:9.1f})  "
            f"torch {torch_ms * 1e3:10.1f} us  K/V {kv_bw / 1e12:5.2f} TB/s  {tflops:6.1f} TFLOP/s  "
            f"max|err| {err:.2e}"
        )
        del x, out
        torch.cuda.empty_cache()

    print()
    print(f"{'case':<32} {'triton us':>10} {'graph us':>9} {'torch us':>10} {'speedup':>8} "
          f"{'K/V TB/s':>9} {'% copy':>7} {'TFLOP/s':>8} {'max|err|':>9}")  # fmt: skip
    for case, triton_ms, graph_ms, torch_ms, kv_bw, tflops, err in rows:
        print(
            f"{case.label:<32} {triton_ms * 1e3:10.1f} {graph_ms * 1e3:9.1f} {torch_ms * 1e3:10.1f} "
            f"{torch_ms / triton_ms:7.2f}x {kv_bw / 1e12:9.2f} {100 * kv_bw / copy_bw:6.1f}% {tflops:8.1f} "
            f"{err:9.2e}"
        )
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write); correctness failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
