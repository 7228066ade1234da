"""AttentionBackend on Triton kernels (CUDA and ROCm; CPU tensors under TRITON_INTERPRET=1).

Stores the new K/V with one kernel, then attends with one of two kernels chosen from host
ints only: the split-KV kernel when every request's rows fit one small tile (decode, DSpark
verify windows and drafter blocks: `max_extend_len * G <= MAX_ROWS`), the extend kernel
otherwise (prefill, chunked prefill). A mixed step's forward is attended as its two parts
(AttentionMetadata.parts): its decode rows by the split-KV kernel, its chunks by the extend
kernel; as one forward, the extend kernel would give each decode row a single program over
its whole context (41 of a 61 ms step at 256 sessions, docs/benchmarks.md). A forward whose
requests share a prefix's slots (AttentionMetadata.shared) attends those keys once for all of
them and the rest per request (shared_prefix_attention.py, docs/design.md §4.9). The kernels
read K/V through `req_to_token`, never read the device from the host, and size their grids
from host bounds, so a forward can be captured in a CUDA graph per batch-size bucket
(workspace comes from the graph's memory pool).

A forward's launches (grids, host ints, workspace) are prepared at its first layer; the
layers after it reuse them when they pass the same q/k/v/out tensors and metadata, as the
eager attention between piecewise graphs does (docs/design.md §4.8), so a layer costs only
its kernels' launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.triton.decode_attention import MAX_ROWS, decode_attention_launches, split_kv_rows
from engine.kernels.triton.extend_attention import extend_attention_launches
from engine.kernels.triton.launch import CacheLaunch, check_last_dim_contiguous
from engine.kernels.triton.shared_prefix_attention import cascade_launches
from engine.kernels.triton.store_kv import store_kv_launches


@dataclass(frozen=True)
class _ForwardLaunches:
    """A forward's store and attention launches, prepared at its first layer. Later layers
    that pass the same tensors (a forward whose q/k/v/out are one set of static buffers, as
    piecewise graphs' are) reuse them; every other call prepares its own."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    meta: AttentionMetadata
    scale: float
    launches: tuple[CacheLaunch, ...]

    def serves(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> bool:
        same_tensors = q is self.q and k is self.k and v is self.v and out is self.out
        return same_tensors and meta is self.meta and scale == self.scale


class TritonAttentionBackend:
    name = "triton"

    def __init__(self) -> None:
        # The last forward's launches, kept (outside graph capture) while its layers come;
        # holding its tensors keeps their ids from being reused meanwhile.
        self._last: _ForwardLaunches | None = None

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
        v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,  # [T, Hq, D]; allocated when None
    ) -> torch.Tensor:
        if out is None:
            out = torch.empty_like(q)
        if q.stride(-1) != 1:
            q = q.contiguous()
        last = self._last
        if last is not None and last.serves(q, k, v, out, meta, scale):
            launches = last.launches
        else:
            launches = _prepare(q, k, v, k_cache, v_cache, meta, scale, out)
            # Workspace made under a CUDA graph capture belongs to that graph's pool: it is never kept.
            capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
            self._last = None if capturing else _ForwardLaunches(q, k, v, out, meta, scale, launches)
        for launch in launches:
            launch(k_cache, v_cache)
        return out


def _prepare(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,  # any layer's: every layer's caches have its shape and layout
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
) -> tuple[CacheLaunch, ...]:
    check_last_dim_contiguous("TritonAttentionBackend", k_cache=k_cache, v_cache=v_cache)
    launches = store_kv_launches(k, v, meta.out_slots)
    num_kv_heads = k_cache.shape[1]
    if meta.shared is not None:
        launches += cascade_launches(q, num_kv_heads, meta, scale, out)
    elif meta.parts is None:
        launches += _attend(q, num_kv_heads, meta, scale, out)
    else:
        decode_rows, chunks = meta.parts
        n = decode_rows.num_tokens
        launches += _attend(q[:n], num_kv_heads, decode_rows, scale, out[:n])
        launches += _attend(q[n:], num_kv_heads, chunks, scale, out[n:])
    return tuple(launches)


def _attend(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    num_kv_heads: int,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
) -> list[CacheLaunch]:
    if split_kv_rows(meta, q.shape[1] // num_kv_heads) <= MAX_ROWS:
        return decode_attention_launches(q, num_kv_heads, meta, scale, out)
    return extend_attention_launches(q, num_kv_heads, meta, scale, out)
