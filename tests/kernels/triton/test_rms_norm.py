"""The RMSNorm kernel (alone, fused with the residual add, per head) against its torch
reference at small shapes: interpreted on CPU, compiled on a GPU (model shapes:
test_kernels_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, assert_rounded_like, close, randn

from engine.kernels.norm import add_rms_norm_torch, rms_norm_torch
from engine.kernels.triton.norm import add_rms_norm_triton, rms_norm_triton

EPS = 1e-6


def norm_weight(gen: torch.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(n, generator=gen) + 0.5).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576, 960])
def test_rms_norm(dtype: torch.dtype, hidden: int, gen: torch.Generator) -> None:
    x = randn(gen, 3, hidden, dtype=dtype, scale=3.0)
    weight = norm_weight(gen, hidden, dtype)
    got = rms_norm_triton(x, weight, EPS)
    assert got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got, rms_norm_torch(x, weight, EPS), **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 960])
def test_add_rms_norm(dtype: torch.dtype, hidden: int, gen: torch.Generator) -> None:
    # x is a column slice of a wider tensor: strided rows, as a view of a fused output would be
    x = randn(gen, 4, hidden + 32, dtype=dtype)[:, 16 : 16 + hidden]
    residual = randn(gen, 4, hidden, dtype=dtype, scale=4.0)
    weight = norm_weight(gen, hidden, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    y, residual_out = add_rms_norm_triton(x, residual, weight, EPS)
    y_ref, residual_ref = add_rms_norm_torch(x, residual, weight, EPS)
    assert_rounded_like(residual_out, residual_ref, scale=4.0)  # one rounding of an fp32 sum, as torch's add
    torch.testing.assert_close(y, y_ref, **close(dtype))
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before), "inputs must be left alone"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(4, 2, 32), (3, 1, 48)])
def test_per_head_norm_of_qkv_views(
    dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int, gen: torch.Generator
) -> None:
    """Qwen3's q/k norm: rows are heads of strided [T, heads, D] views of the qkv output."""
    qkv = randn(gen, 5, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype, scale=2.0)
    q, k, _ = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    for x in (q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))):
        weight = norm_weight(gen, head_dim, dtype)
        got = rms_norm_triton(x, weight, EPS)
        assert got.shape == x.shape and got.is_contiguous()
        torch.testing.assert_close(got, rms_norm_torch(x, weight, EPS), **close(dtype))


def test_weight_dtype_promotes_and_any_leading_dims(gen: torch.Generator) -> None:
    x = randn(gen, 2, 3, 2, 40, dtype=torch.bfloat16)
    weight = norm_weight(gen, 40, torch.float32)
    got = rms_norm_triton(x, weight, EPS)
    expected = rms_norm_torch(x, weight, EPS)
    assert got.dtype == expected.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got, expected, **close(torch.bfloat16))


def test_mismatched_inputs_are_rejected(gen: torch.Generator) -> None:
    x = randn(gen, 2, 16)
    with pytest.raises(ValueError, match="weight has shape"):
        rms_norm_triton(x, norm_weight(gen, 8, torch.float32), EPS)
    with pytest.raises(ValueError, match="must match"):
        add_rms_norm_triton(x, x.to(torch.float16), norm_weight(gen, 16, torch.float32), EPS)
