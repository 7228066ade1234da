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
"""

from __future__ import annotations

import torch

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.triton.decode_attention import MAX_ROWS, decode_attention, split_kv_rows
from engine.kernels.triton.extend_attention import extend_attention
from engine.kernels.triton.shared_prefix_attention import cascade_attention
from engine.kernels.triton.store_kv import store_kv_triton


class TritonAttentionBackend:
    name = "triton"

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
        store_kv_triton(k, v, k_cache, v_cache, meta.out_slots)
        if out is None:
            out = torch.empty_like(q)
        if q.stride(-1) != 1:
            q = q.contiguous()
        if meta.shared is not None:
            return cascade_attention(q, k_cache, v_cache, meta, scale, out)
        if meta.parts is None:
            return _attend(q, k_cache, v_cache, meta, scale, out)
        decode_rows, chunks = meta.parts
        n = decode_rows.num_tokens
        _attend(q[:n], k_cache, v_cache, decode_rows, scale, out[:n])
        _attend(q[n:], k_cache, v_cache, chunks, scale, out[n:])
        return out


def _attend(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
) -> torch.Tensor:
    group = q.shape[1] // k_cache.shape[1]
    if split_kv_rows(meta, group) <= MAX_ROWS:
        return decode_attention(q, k_cache, v_cache, meta, scale, out)
    return extend_attention(q, k_cache, v_cache, meta, scale, out)
