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

`rotary_embedding_torch` is the reference and the fallback path; the Triton kernel
(engine/kernels/triton/rope.py) does q and k in one launch, gathering cos/sin at the token's
position itself, and writes new contiguous q/k (never in place: callers may still hold their
inputs); tests/kernels/triton/test_rope.py compares the two. The C kernel of CPU rows is
engine/kernels/cpu/elementwise.py; `RotaryAngles` picks one.
"""

from __future__ import annotations

import torch

from engine.kernels.cpu import elementwise as cpu_elementwise
from engine.kernels.dispatch import use_triton
from engine.kernels.triton.rope import rotary_embedding_triton


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
