"""The fused silu-and-mul kernel against its torch reference at small shapes: interpreted on
CPU, compiled on a GPU (model shapes: test_kernels_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DTYPES, close, randn

from engine.kernels.activation import BLOCK, silu_and_mul_torch, silu_and_mul_triton


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter_size", [48, 960, BLOCK + 512])  # the last spans two programs, one partial
def test_silu_and_mul_matches_reference(dtype: torch.dtype, inter_size: int, gen: torch.Generator) -> None:
    x = randn(gen, 3, 2 * inter_size, dtype=dtype, scale=3.0)
    got = silu_and_mul_triton(x)
    assert got.shape == (3, inter_size) and got.dtype == dtype
    torch.testing.assert_close(got, silu_and_mul_torch(x), **close(dtype, scale=10.0))


def test_strided_rows_and_leading_dims(gen: torch.Generator) -> None:
    wide = randn(gen, 4, 2 * 40 + 8)
    rows = wide[:, : 2 * 40]  # row stride 88
    torch.testing.assert_close(silu_and_mul_triton(rows), silu_and_mul_torch(rows))
    batched = randn(gen, 2, 3, 2 * 40)
    got = silu_and_mul_triton(batched)
    assert got.shape == (2, 3, 40)
    torch.testing.assert_close(got, silu_and_mul_torch(batched))


def test_odd_width_is_rejected(gen: torch.Generator) -> None:
    with pytest.raises(ValueError, match="must be even"):
        silu_and_mul_triton(randn(gen, 2, 7))
