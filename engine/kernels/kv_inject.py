"""KV injection: write the drafter's context K/V for target tokens into the draft KV pool.

Input is one drafter layer's slice of the stacked projection of the context vectors,
`kv [N, 2*Hkv*D]` (columns `[k heads | v heads]`, last dim contiguous, rows may be
strided). For each token: K gets the layer's per-head k_norm (RMSNorm over D) and NeoX
RoPE (rotate_half over the first `2*half` dims) with the given cos/sin; V is stored as is.
Row t goes to cache row `slots[t]`; slot -1 skips the token (the torch path writes it to
the last, sink row; the Triton kernel writes nothing).

`inject_layer_kv_torch` here is the reference; `inject_layer_kv_triton`
(engine/kernels/triton/kv_inject.py) fuses norm + RoPE + scatter in one launch (grid N) and is
checked against it (tests/speculative/test_kv_inject.py); `inject_layer_kv` picks one.
"""

from __future__ import annotations

import torch

from engine.kernels.triton import launch
from engine.kernels.triton.kv_inject import inject_layer_kv_triton


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D]; cos/sin [N, half] with 2*half <= D: rotate_half RoPE on the first
    2*half dims, the rest pass through. Computes in x's dtype."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def inject_layer_kv_torch(
    kv: torch.Tensor,  # [N, 2*Hkv*D]
    k_norm_weight: torch.Tensor,  # [D]
    eps: float,
    cos: torch.Tensor,  # [N, half] float32
    sin: torch.Tensor,  # [N, half] float32
    slots: torch.Tensor,  # [N] int64, -1 = skip (lands in the sink row)
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
) -> None:
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    n = kv.shape[0]
    k = kv[:, : num_kv_heads * head_dim].reshape(n, num_kv_heads, head_dim).float()
    v = kv[:, num_kv_heads * head_dim :].reshape(n, num_kv_heads, head_dim)
    k = k * torch.rsqrt(k.pow(2).mean(dim=-1, keepdim=True) + eps) * k_norm_weight.float()
    k = rope_neox(k, cos.float(), sin.float())
    k_cache[slots] = k.to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)


def inject_layer_kv(
    kv: torch.Tensor,
    k_norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    use_triton: bool | None = None,
) -> None:
    """The Triton kernel on GPU (when triton is installed), else the torch reference."""
    if use_triton is None:
        use_triton = k_cache.is_cuda and launch.available()
    impl = inject_layer_kv_triton if use_triton else inject_layer_kv_torch
    impl(kv, k_norm_weight, eps, cos, sin, slots, k_cache, v_cache)
