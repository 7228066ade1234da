"""Triton kernel of rotary position embedding (NeoX / Hugging Face Llama layout) on q and k
together (the reference, its rounding rules, and the dispatcher are in engine/kernels/rope.py;
tests/kernels/triton/test_rope.py compares).

One launch for q and k: a program rotates a block of heads of one token, gathering cos/sin at
the token's position itself, repeating the reference's roundings in fp32 registers. It reads
q and k as strided views (the column slices of the fused qkv output; only the last dim must be
contiguous) and writes new contiguous q/k.
"""

from __future__ import annotations

import torch

from engine.kernels.triton.launch import check_last_dim_contiguous, jit_on_first_use, require_triton, tl, triton

HEAD_TILE_ELEMENTS = 2048  # a program rotates as many heads as fit this many elements


def _rotary_kernel(
    positions_ptr,
    cos_sin_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,  # [T, Hq, D] contiguous
    k_out_ptr,  # [T, Hkv, D] contiguous
    stride_cs,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROPE_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,  # heads per program (power of two)
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
):
    # Program (token, head block): heads [0, Hq) of q then [0, Hkv) of k, as one axis.
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    dims = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    is_q = heads < NUM_Q_HEADS
    kv_heads = tl.where(is_q, 0, heads - NUM_Q_HEADS)
    mask = (heads < NUM_Q_HEADS + NUM_KV_HEADS) & (dims < HEAD_DIM)
    src = tl.where(
        is_q, q_ptr + token * stride_qt + heads * stride_qh, k_ptr + token * stride_kt + kv_heads * stride_kh
    )
    dst = tl.where(
        is_q,
        q_out_ptr + (token * NUM_Q_HEADS + heads) * HEAD_DIM,
        k_out_ptr + (token * NUM_KV_HEADS + kv_heads) * HEAD_DIM,
    )
    dtype = q_ptr.dtype.element_ty

    # rotate_half partner of dim d: d + half below half, d - half in [half, 2*half).
    in_rope = dims < 2 * ROPE_HALF
    first_half = dims < ROPE_HALF
    freq = tl.where(first_half, dims, dims - ROPE_HALF)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cs_row = cos_sin_ptr + position * stride_cs
    cos = tl.load(cs_row + freq, mask=in_rope, other=1.0).to(dtype).to(tl.float32)
    sin = tl.load(cs_row + ROPE_HALF + freq, mask=in_rope, other=0.0).to(dtype).to(tl.float32)

    x = tl.load(src + dims, mask=mask, other=0.0)
    partner = tl.load(src + tl.where(first_half, dims + ROPE_HALF, freq), mask=mask & in_rope, other=0.0)
    # first half: x1*cos - x2*sin; second half: x2*cos + x1*sin; each op rounded to dtype.
    x_cos = (x.to(tl.float32) * cos).to(dtype).to(tl.float32)
    partner_sin = (partner.to(tl.float32) * sin).to(dtype).to(tl.float32)
    rotated = tl.where(first_half, x_cos - partner_sin, x_cos + partner_sin).to(dtype)
    tl.store(dst + dims, tl.where(in_rope, rotated, x), mask=mask)


_compiled = jit_on_first_use(_rotary_kernel)


def rotary_embedding_triton(
    positions: torch.Tensor,  # [T] int32/int64
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous (rows and heads may be strided)
    k: torch.Tensor,  # [T, Hkv, D], q's dtype, last dim contiguous
    cos_sin_cache: torch.Tensor,  # [max_position, rope_dim], last dim contiguous
) -> tuple[torch.Tensor, torch.Tensor]:  # new contiguous q [T, Hq, D], k [T, Hkv, D]
    """One launch, grid (T, head blocks of q and k together); graph-capturable."""
    require_triton("rotary_embedding_triton")
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    rope_dim = cos_sin_cache.shape[-1]
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or k.dtype != q.dtype:
        raise ValueError(f"rotary: k {tuple(k.shape)} {k.dtype} does not pair with q {tuple(q.shape)} {q.dtype}")
    if rope_dim % 2 or not 0 < rope_dim <= head_dim:
        raise ValueError(f"rotary: rope_dim must be even and in (0, head_dim={head_dim}], got {rope_dim}")
    check_last_dim_contiguous("rotary_embedding_triton", q=q, k=k, cos_sin_cache=cos_sin_cache)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    total_heads = num_q_heads + num_kv_heads
    if num_tokens == 0 or total_heads == 0:
        return q_out, k_out
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(total_heads), max(1, HEAD_TILE_ELEMENTS // block_d))
    _compiled()[(num_tokens, triton.cdiv(total_heads, block_h))](
        positions,
        cos_sin_cache,
        q,
        k,
        q_out,
        k_out,
        cos_sin_cache.stride(0),
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        ROPE_HALF=rope_dim // 2,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
    )
    return q_out, k_out
