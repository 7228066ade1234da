"""What the launchers of the two paged-attention kernels (decode_attention.py, extend_attention.py)
pass alike: the leading positional arguments both kernels take in the same order, and the
compile-time constants both derive the same way from the tensors and the metadata."""

from __future__ import annotations

import math

import torch
import triton

from engine.kernels.attention_metadata import AttentionMetadata

LOG2E = math.log2(math.e)  # the kernels take scale * LOG2E and work in the exp2 domain


def rows_per_request(meta: AttentionMetadata) -> int:
    """New tokens of the longest request's extend (the uniform extend when there is one)."""
    return meta.uniform_extend if meta.uniform_extend is not None else meta.max_extend_len


def paged_args(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
) -> tuple[object, ...]:
    """The first 19 arguments of both kernels: tensors, scale_log2e, then strides."""
    return (
        q,
        k_cache,
        v_cache,
        meta.req_to_token,
        meta.req_rows,
        meta.seq_lens,
        meta.extend_lens,
        meta.q_start,
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        meta.req_to_token.stride(0),
        out.stride(0),
        out.stride(1),
    )


def paged_constants(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> dict[str, object]:
    """GROUP, HEAD_DIM, BLOCK_D, CAUSAL and INPUT_PRECISION of both kernels."""
    head_dim = q.shape[2]
    return {
        "GROUP": q.shape[1] // k_cache.shape[1],
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs K >= 16
        "CAUSAL": meta.causal,
        # fp32 inputs: exact products; None: the target default (tf32 is not on ROCm)
        "INPUT_PRECISION": "ieee" if q.dtype == torch.float32 else None,
    }
