"""The fused q/k rotary kernel against its torch reference at small shapes: interpreted on
CPU, compiled on a GPU (model shapes: test_kernels_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, assert_rounded_like, randn

from engine.config import RopeScaling
from engine.kernels.rope import RotaryAngles, rotary_embedding_torch
from engine.kernels.triton.rope import rotary_embedding_triton
from engine.models.layers import RotaryEmbedding

MAX_POSITION = 64


def qkv_views(
    gen: torch.Generator, tokens: int, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hkv, D] as the attention layer gets them: strided column views
    of one fused qkv output."""
    qkv = randn(gen, tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))


def cache(head_dim: int, rope_dim: int, scaling: RopeScaling | None = None) -> torch.Tensor:
    rope = RotaryEmbedding(head_dim, rope_dim, MAX_POSITION, 10000.0, scaling)
    return rope.cos_sin_cache.to(DEVICE)  # [MAX_POSITION, rope_dim] float32


def check(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    q_before, k_before = q.clone(), k.clone()
    q_out, k_out = rotary_embedding_triton(positions, q, k, cos_sin)
    q_ref, k_ref = rotary_embedding_torch(positions, q, k, cos_sin)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    if q.dtype == torch.float32 and DEVICE.type == "cuda":  # the compiler may fuse x*cos - y*sin into an FMA
        torch.testing.assert_close(q_out, q_ref)
        torch.testing.assert_close(k_out, k_ref)
    else:
        assert_rounded_like(q_out, q_ref, scale=3.0)
        assert_rounded_like(k_out, k_ref, scale=3.0)
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "inputs must be left alone"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "head_dim", "rope_dim"),
    [
        (4, 2, 16, 16),  # full rotary
        (6, 2, 32, 16),  # partial rotary: the last 16 dims pass through
        (3, 1, 40, 24),  # head_dim and rope_dim not powers of two
        (20, 4, 8, 8),  # more heads than one program's tile
    ],
)
def test_rotary_matches_reference(
    dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int, rope_dim: int, gen: torch.Generator
) -> None:
    q, k = qkv_views(gen, 5, q_heads, kv_heads, head_dim, dtype)
    positions = torch.randint(0, MAX_POSITION, (5,), generator=gen).to(DEVICE)
    check(q, k, positions, cache(head_dim, rope_dim))


def test_scaled_cache_and_contiguous_inputs(gen: torch.Generator) -> None:
    yarn = RopeScaling(kind="yarn", factor=4.0, original_max_position=16)  # cos/sin scaled by mscale
    q = randn(gen, 3, 2, 16, dtype=torch.float16)
    k = randn(gen, 3, 1, 16, dtype=torch.float16)
    check(q, k, torch.tensor([0, 63, 17], device=DEVICE), cache(16, 16, yarn))


def test_q_or_k_without_heads(gen: torch.Generator) -> None:
    """The drafter rotates q alone and k alone (the other a [T, 0, D] view)."""
    x = randn(gen, 4, 3, 16)
    positions = torch.tensor([5, 1, 0, 9], device=DEVICE)
    cos_sin = cache(16, 8)
    check(x, x[:, :0], positions, cos_sin)
    check(x[:, :0], x, positions, cos_sin)


def test_mismatched_inputs_are_rejected(gen: torch.Generator) -> None:
    q, k = randn(gen, 2, 2, 16), randn(gen, 2, 1, 16)
    positions = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="does not pair"):
        rotary_embedding_triton(positions, q, k.to(torch.float16), cache(16, 16))
    q_dims_strided = randn(gen, 2, 4, 2).transpose(1, 2)  # [2, 2, 4], dim stride 2
    with pytest.raises(ValueError, match="contiguous last dim"):
        rotary_embedding_triton(positions, q_dims_strided, randn(gen, 2, 1, 4), cache(4, 4))


def rotate_half_textbook(
    positions: torch.Tensor, x: torch.Tensor, cos_sin: torch.Tensor
) -> torch.Tensor:  # Hugging Face's apply_rotary_pos_emb, op by op, on the first rope_dim dims
    rope_dim = cos_sin.shape[-1]
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., :rope_dim].chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rope_dim:]], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "rope_dim"), [(16, 16), (32, 16), (40, 24)])
def test_torch_rotation_is_the_textbook_formula_bit_for_bit(
    dtype: torch.dtype, head_dim: int, rope_dim: int, gen: torch.Generator
) -> None:
    """The torch path folds rotate_half's sign into its sin table: no rounding may change."""
    q, k = qkv_views(gen, 6, 6, 2, head_dim, dtype)
    q, k = q * 40, k * 1e-3  # large and small magnitudes
    positions = torch.randint(0, MAX_POSITION, (6,), generator=gen).to(DEVICE)
    cos_sin = cache(head_dim, rope_dim)
    q_out, k_out = rotary_embedding_torch(positions, q, k, cos_sin)
    assert torch.equal(q_out, rotate_half_textbook(positions, q, cos_sin))
    assert torch.equal(k_out, rotate_half_textbook(positions, k, cos_sin))


def test_rotary_angles_serve_every_layer_and_dtype(gen: torch.Generator) -> None:
    """One forward's RotaryAngles, applied by several layers (and in two dtypes), gives each
    call what a fresh rotation would. On CPU, where its torch path keeps the tables between
    calls (on GPU it launches the Triton kernel each time, tested above)."""
    positions = torch.randint(0, MAX_POSITION, (5,), generator=gen)
    cos_sin = cache(32, 16).cpu()
    rope = RotaryAngles(positions, cos_sin)
    for dtype in (torch.bfloat16, torch.float32, torch.bfloat16):
        q, k = (t.cpu() for t in qkv_views(gen, 5, 4, 2, 32, dtype))
        q_out, k_out = rope(q, k)
        q_ref, k_ref = rotary_embedding_torch(positions, q, k, cos_sin)
        assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    assert set(rope._tables) == {torch.bfloat16, torch.float32}
