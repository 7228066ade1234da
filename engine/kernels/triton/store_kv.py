"""Triton kernel writing the new tokens' keys and values into the paged KV cache (the
reference and the dispatcher are in engine/kernels/store_kv.py;
tests/kernels/triton/test_store_kv.py compares).

`k_cache, v_cache: [num_slots + 1, Hkv, D]`; token t goes to row `out_slots[t]`. Slot -1 is
not written at all (the torch reference writes it into the sink row).
"""

from __future__ import annotations

import torch

from engine.kernels.triton.launch import (
    CacheLaunch,
    LayerLaunch,
    check_last_dim_contiguous,
    jit_on_first_use,
    require_triton,
    tl,
    triton,
)


def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_slots_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HD: tl.constexpr,  # next power of two >= NUM_KV_HEADS * HEAD_DIM
):
    # One program per token: copies its [Hkv, D] keys and values (last dim contiguous).
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(out_slots_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK_HD)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    mask = offs < tl.where(slot >= 0, NUM_KV_HEADS * HEAD_DIM, 0)  # slot -1: store nothing
    k = tl.load(k_ptr + token * stride_kt + head * stride_kh + dim, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + head * stride_vh + dim, mask=mask)
    tl.store(
        k_cache_ptr + slot * stride_kc_slot + head * stride_kc_h + dim,
        k.to(k_cache_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(
        v_cache_ptr + slot * stride_vc_slot + head * stride_vc_h + dim,
        v.to(v_cache_ptr.dtype.element_ty),
        mask=mask,
    )


_compiled = jit_on_first_use(_store_kv_kernel)


def store_kv_triton(
    k: torch.Tensor,  # [T, Hkv, D], last dim contiguous (a view of a fused qkv output is fine)
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D], last dim contiguous
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,  # [T] int32/int64, -1 = skip (not written)
) -> None:
    """One launch, grid (T,). Graph-capturable; never reads the device."""
    check_last_dim_contiguous("store_kv_triton", k_cache=k_cache, v_cache=v_cache)
    for launch in store_kv_launches(k, v, out_slots):
        launch(k_cache, v_cache)


def store_kv_launches(
    k: torch.Tensor,  # [T, Hkv, D], last dim contiguous
    v: torch.Tensor,  # [T, Hkv, D]
    out_slots: torch.Tensor,  # [T] int32/int64, -1 = skip (not written)
) -> list[CacheLaunch]:
    """store_kv_triton's launch (none for no tokens), prepared once for every layer whose
    caches have a contiguous last dim."""
    require_triton("store_kv_triton")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return []
    check_last_dim_contiguous("store_kv_triton", k=k, v=v)
    kernel = LayerLaunch(_compiled(), (num_tokens,))
    args = (k, v)
    strides = (k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    constants = {
        "NUM_KV_HEADS": num_kv_heads,
        "HEAD_DIM": head_dim,
        "BLOCK_HD": triton.next_power_of_2(num_kv_heads * head_dim),
    }

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        kernel(
            *args, k_cache, v_cache, out_slots, *strides, k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
            v_cache.stride(1), **constants,
        )  # fmt: skip

    return [launch]
