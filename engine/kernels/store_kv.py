"""Write the new tokens' keys and values into the paged KV cache.

`k_cache, v_cache: [num_slots + 1, Hkv, D]`; token t goes to row `out_slots[t]`. Slot -1
means "skip": the torch path writes it into the last row (a sink nobody reads, which is what
negative indexing does), the Triton kernel does not write it at all.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without the `gpu` extra run the torch path only
    triton = None


def store_kv_torch(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    out_slots: torch.Tensor,  # [T] int64, -1 = skip (lands in the sink row)
) -> None:
    """Reference: one index_put per cache. Sync-free (no host read of `out_slots`)."""
    k_cache[out_slots] = k.to(k_cache.dtype)
    v_cache[out_slots] = v.to(v_cache.dtype)


if triton is not None:

    @triton.jit
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


def store_kv_triton(
    k: torch.Tensor,  # [T, Hkv, D], last dim contiguous (a view of a fused qkv output is fine)
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D], last dim contiguous
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,  # [T] int32/int64, -1 = skip (not written)
) -> None:
    """Triton kernel: one launch, grid (T,). Graph-capturable; never reads the device."""
    if triton is None:
        raise RuntimeError("store_kv_triton needs triton (pip install 'dspark-serve[gpu]')")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"store_kv_triton: {name} must have a contiguous last dim, strides {t.stride()}")
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        out_slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HD=triton.next_power_of_2(num_kv_heads * head_dim),
    )


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,
) -> None:
    """Store with the Triton kernel on GPU (when triton is installed), else with torch."""
    if k_cache.is_cuda and triton is not None:
        store_kv_triton(k, v, k_cache, v_cache, out_slots)
    else:
        store_kv_torch(k, v, k_cache, v_cache, out_slots)
