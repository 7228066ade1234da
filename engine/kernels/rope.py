"""Rotary position embedding (NeoX / Hugging Face Llama layout) applied to q and k together.

`cos_sin_cache [max_position, rope_dim]` holds cos in its first half and sin in its second,
per position (engine.models.layers.RotaryEmbedding builds it, float32). For every head the
first `rope_dim` dims are rotated in pairs (d, d + rope_dim/2) (`rotate_half`); the dims
past `rope_dim` (partial rotary) pass through unchanged.

The arithmetic is in the activation dtype, as the torch reference and Hugging Face do: cos
and sin are rounded to it, and each product and the sum are rounded as separate torch ops
would round them (the torch path folds rotate_half's sign into its sin table, which
changes no rounding). The Triton kernel repeats those roundings in fp32 registers, so compiled
it matches the reference bit for bit in bf16 and fp16; in fp32 the compiler may fuse a
product and the sum into an FMA (a last-bit difference).

`rotary_embedding_torch` is the reference and the CPU path; the Triton kernel does q and k
in one launch, gathering cos/sin at the token's position itself, and writes new contiguous
q/k (never in place: callers may still hold their inputs). It reads q and k as strided
views (the column slices of the fused qkv output); only the last dim must be contiguous.
`tests/kernels/test_rope.py` compares the two.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from engine.kernels.cpu import elementwise as cpu_elementwise
from engine.kernels.dispatch import use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without the `gpu` extra run the torch path only
    triton = None

HEAD_TILE_ELEMENTS = 2048  # a program rotates as many heads as fit this many elements


def rope_tables_torch(
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_position, rope_dim]
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, 1, rope_dim], [T, 1, rope_dim]) in `dtype`
    """cos and sin at `positions`, rounded to the activation dtype and laid out for a
    whole-width rotation: ([cos | cos], [-sin | sin])."""
    cos, sin = cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def rotate_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated on its first rope_dim dims by tables of `rope_tables_torch`; a new
    tensor. `x * cos + rotate_half(x) * sin` with the sign of sin folded into the table is
    x1*cos - x2*sin | x2*cos + x1*sin with every product and sum rounded as there (negation
    is exact), in 4 ops instead of 7."""
    rope_dim = cos.shape[-1]
    half = rope_dim // 2
    rot, rest = x[..., :rope_dim], x[..., rope_dim:]
    partner = torch.cat([rot[..., half:], rot[..., :half]], dim=-1)  # rotate_half without its sign
    out = (rot * cos).add_(partner * sin)
    return out if rope_dim == x.shape[-1] else torch.cat([out, rest], dim=-1)


def rotary_embedding_torch(
    positions: torch.Tensor,  # [T] int64
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    cos_sin_cache: torch.Tensor,  # [max_position, rope_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope_tables_torch(positions, cos_sin_cache, q.dtype)
    return rotate_torch(q, cos, sin), rotate_torch(k, cos, sin)


if triton is not None:

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


@functools.cache
def _compiled() -> Any:  # a triton JITFunction, launched as kernel[grid](...)
    # Wrapped on first use, so TRITON_INTERPRET set by then decides interpreter or GPU.
    assert triton is not None
    return triton.jit(_rotary_kernel)


def rotary_embedding_triton(
    positions: torch.Tensor,  # [T] int32/int64
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous (rows and heads may be strided)
    k: torch.Tensor,  # [T, Hkv, D], q's dtype, last dim contiguous
    cos_sin_cache: torch.Tensor,  # [max_position, rope_dim], last dim contiguous
) -> tuple[torch.Tensor, torch.Tensor]:  # new contiguous q [T, Hq, D], k [T, Hkv, D]
    """One launch, grid (T, head blocks of q and k together); graph-capturable."""
    if triton is None:
        raise RuntimeError("rotary_embedding_triton needs triton (pip install 'dspark-serve[gpu]')")
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    rope_dim = cos_sin_cache.shape[-1]
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or k.dtype != q.dtype:
        raise ValueError(f"rotary: k {tuple(k.shape)} {k.dtype} does not pair with q {tuple(q.shape)} {q.dtype}")
    if rope_dim % 2 or not 0 < rope_dim <= head_dim:
        raise ValueError(f"rotary: rope_dim must be even and in (0, head_dim={head_dim}], got {rope_dim}")
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"rotary_embedding_triton: {name} must have a contiguous last dim, strides {t.stride()}")
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


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [T, Hq, D] and k [T, Hkv, D] at positions [T]: the Triton kernel on GPU, the
    torch reference elsewhere. Returns new tensors in both cases."""
    return RotaryAngles(positions, cos_sin_cache)(q, k)


class RotaryAngles:
    """RoPE at one forward's positions, applied by every layer of that forward. The torch
    path gathers and rounds cos/sin once per forward (per dtype) instead of once per layer;
    the Triton kernel reads them from the cache itself."""

    def __init__(self, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
        self.positions = positions  # [T] int64
        self.cos_sin_cache = cos_sin_cache  # [max_position, rope_dim]
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) at the positions, rounded to `dtype` (rope_tables_torch), made once."""
        tables = self._tables.get(dtype)
        if tables is None:
            tables = self._tables[dtype] = rope_tables_torch(self.positions, self.cos_sin_cache, dtype)
        return tables

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] -> new rotated (q, k); the inputs are left as they were."""
        if use_triton(q, k):
            return rotary_embedding_triton(self.positions, q, k, self.cos_sin_cache)
        tables = self.tables(q.dtype)
        if cpu_elementwise.available(q, k):
            return cpu_elementwise.rope(q, *tables), cpu_elementwise.rope(k, *tables)
        return rotate_torch(q, *tables), rotate_torch(k, *tables)
