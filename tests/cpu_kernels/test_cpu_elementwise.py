"""The C elementwise kernels (engine/kernels/cpu/elementwise.c) against their torch
references on fresh random inputs: bit for bit in bf16 where the reference's roundings are
repeated, to fp32 rounding in fp32; and the dispatchers taking them on CPU. RMSNorm's fp32
mean may differ in summation order, which can move the normalised value one bf16 step and,
through the rounded product with the weight, the output by two."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import add_rms_norm, rms_norm, silu_and_mul
from engine.kernels.activation import silu_and_mul_torch
from engine.kernels.cpu import elementwise
from engine.kernels.norm import add_rms_norm_torch, rms_norm_torch
from engine.kernels.rope import RotaryAngles, rope_tables_torch, rotate_torch

pytestmark = pytest.mark.skipif(
    not elementwise.available(torch.zeros(1, 1)), reason="no C compiler: the kernels cannot be built"
)
DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 16, 300]  # one decode row, a decode batch, a prefill chunk (threaded)


def close(got: torch.Tensor, expected: torch.Tensor, bf16_steps: int = 0) -> None:
    """Equal in bf16 (or within `bf16_steps` bf16 steps of the value); fp32 to rounding."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if got.dtype == torch.bfloat16:
        if bf16_steps == 0:
            assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()
        else:
            torch.testing.assert_close(got, expected, rtol=bf16_steps * 2**-7, atol=1e-6)
    else:
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(rows: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, 2 * 576, generator=gen).to(dtype)
    x = wide[:, :576]  # strided rows, as the model's views are
    residual = torch.randn(rows, 576, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
    close(rms_norm(x, weight, 1e-5), rms_norm_torch(x, weight, 1e-5), bf16_steps=2)
    normed, summed = add_rms_norm(x, residual, weight, 1e-5)
    normed_ref, summed_ref = add_rms_norm_torch(x, residual, weight, 1e-5)
    close(summed, summed_ref)
    close(normed, normed_ref, bf16_steps=2)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(rows: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = (4 * torch.randn(rows, 2 * 1536, generator=gen)).to(dtype)
    x[0, :8] = torch.tensor([-100.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0])  # tails of exp
    close(silu_and_mul(x), silu_and_mul_torch(x), bf16_steps=1)


@pytest.mark.parametrize("rope_dim", [64, 32])  # whole head, and a partial rotation
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(rows: int, dtype: torch.dtype, rope_dim: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (9 + 3 + 3) * 64, generator=gen).to(dtype)
    q = qkv[:, : 9 * 64].unflatten(-1, (9, 64))  # strided views of the fused projection
    k = qkv[:, 9 * 64 : 12 * 64].unflatten(-1, (3, 64))
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    cos_sin_cache = torch.randn(4096, rope_dim, generator=gen)
    q_rot, k_rot = RotaryAngles(positions, cos_sin_cache)(q, k)
    tables = rope_tables_torch(positions, cos_sin_cache, dtype)
    close(q_rot, rotate_torch(q, *tables))
    close(k_rot, rotate_torch(k, *tables))


def test_not_taken_where_autograd_records():
    weight = torch.ones(8, requires_grad=True)
    x = torch.randn(2, 8)
    assert not elementwise.available(x, weight)
    with torch.no_grad():
        assert elementwise.available(x, weight)
    assert not elementwise.available(x.half())  # fp16: the torch path
