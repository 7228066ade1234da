"""Triton kernel of DSpark's KV injection: one drafter layer's context K/V, fused k_norm +
NeoX RoPE + scatter into the draft KV pool, one launch of one program per token (the reference
and the dispatcher are in engine/kernels/kv_inject.py; tests/speculative/test_kv_inject.py
compares). Slot -1 is not written at all.
"""

from __future__ import annotations

import torch

from engine.kernels.triton.launch import check_last_dim_contiguous, jit_on_first_use, require_triton, tl, triton


def _inject_layer_kv_kernel(
    kv_ptr,
    k_norm_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_kv_row,
    stride_cs_row,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    eps,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROPE_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,  # next power of two >= NUM_KV_HEADS
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
):
    # One program per token: all kv heads of one layer, [BLOCK_H, BLOCK_D] tiles.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    row = kv_ptr + token * stride_kv_row
    k = tl.load(row + heads * HEAD_DIM + dims, mask=mask, other=0.0).to(tl.float32)
    # tl.sum spelled as the reduce it is: the interpreter patches tl.reduce, while tl.sum
    # itself stays a compiled-mode function when triton was imported before
    # TRITON_INTERPRET was set (e.g. by an earlier test).
    sum_sq = tl.reduce(k * k, 1, tl.standard._sum_combine)  # [BLOCK_H]
    rstd = 1.0 / tl.sqrt(sum_sq / HEAD_DIM + eps)
    w = tl.load(k_norm_ptr + dims, mask=dims < HEAD_DIM, other=0.0).to(tl.float32)
    k_normed = k * rstd[:, None] * w

    # rotate_half partner of dim d: d + half below half, d - half in [half, 2*half).
    in_rope = dims < 2 * ROPE_HALF
    first_half = dims < ROPE_HALF
    partner = tl.where(first_half, dims + ROPE_HALF, dims - ROPE_HALF)
    partner_mask = mask & in_rope
    k_partner = tl.load(row + heads * HEAD_DIM + partner, mask=partner_mask, other=0.0).to(tl.float32)
    w_partner = tl.load(k_norm_ptr + partner, mask=(dims < HEAD_DIM) & in_rope, other=0.0).to(tl.float32)
    k_partner = k_partner * rstd[:, None] * w_partner
    freq = tl.where(first_half, dims, dims - ROPE_HALF)
    cos = tl.load(cos_ptr + token * stride_cs_row + freq, mask=in_rope, other=1.0)
    sin = tl.load(sin_ptr + token * stride_cs_row + freq, mask=in_rope, other=0.0)
    sign = tl.where(first_half, -1.0, 1.0)
    k_out = tl.where(in_rope, k_normed * cos + sign * k_partner * sin, k_normed)

    # Broadcast the slot test to the tile first: the interpreter rejects a 2-D & 0-d mask.
    store_mask = mask & ((dims * 0 + slot) >= 0)
    tl.store(
        k_cache_ptr + slot * stride_kc_slot + heads * stride_kc_h + dims,
        k_out.to(k_cache_ptr.dtype.element_ty),
        mask=store_mask,
    )
    v = tl.load(row + NUM_KV_HEADS * HEAD_DIM + heads * HEAD_DIM + dims, mask=mask, other=0.0)
    tl.store(
        v_cache_ptr + slot * stride_vc_slot + heads * stride_vc_h + dims,
        v.to(v_cache_ptr.dtype.element_ty),
        mask=store_mask,
    )


_compiled = jit_on_first_use(_inject_layer_kv_kernel)


def inject_layer_kv_triton(
    kv: torch.Tensor,  # [N, 2*Hkv*D], last dim contiguous
    k_norm_weight: torch.Tensor,  # [D] contiguous
    eps: float,
    cos: torch.Tensor,  # [N, half] float32, last dim contiguous
    sin: torch.Tensor,  # [N, half] float32, same strides as cos
    slots: torch.Tensor,  # [N] int32/int64, -1 = skip (not written)
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D], last dim contiguous
    v_cache: torch.Tensor,
) -> None:
    """One launch, grid (N,). Graph-capturable; never reads the device."""
    require_triton("inject_layer_kv_triton")
    num_tokens = kv.shape[0]
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    cos, sin = cos.float(), sin.float()
    if kv.shape[1] != 2 * num_kv_heads * head_dim:
        raise ValueError(f"kv has {kv.shape[1]} columns, expected 2*{num_kv_heads}*{head_dim}")
    if cos.stride() != sin.stride():
        raise ValueError(f"cos and sin must share strides, got {cos.stride()} and {sin.stride()}")
    check_last_dim_contiguous("inject_layer_kv_triton", kv=kv, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache)
    if num_tokens == 0:
        return
    _compiled()[(num_tokens,)](
        kv,
        k_norm_weight.contiguous(),
        cos,
        sin,
        slots,
        k_cache,
        v_cache,
        kv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        eps,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        ROPE_HALF=cos.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
