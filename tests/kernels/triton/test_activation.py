"""The fused silu-and-mul kernel against its torch reference at small shapes: interpreted on
CPU, compiled on a GPU (model shapes: test_kernels_gpu.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kernel_cases import DTYPES, close, randn

from engine.kernels.activation import silu_and_mul_torch
from engine.kernels.triton.activation import BLOCK, silu_and_mul_triton


def tolerance(dtype: torch.dtype) -> dict[str, Any]:
    """silu(gate) is rounded to the dtype before the product on both sides, but the kernel's
    exp and torch's may differ by an fp32 ulp, which can flip that rounding: in fp16 the
    results may then sit two ulps apart, past assert_close's default rtol (about one ulp)."""
    if dtype == torch.float16:
        return {"rtol": 2 * torch.finfo(dtype).eps, "atol": 1e-5}
    return close(dtype, scale=10.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter_size", [48, 960, BLOCK + 512])  # the last spans two programs, one partial
def test_silu_and_mul_matches_reference(dtype: torch.dtype, inter_size: int, gen: torch.Generator) -> None:
    x = randn(gen, 3, 2 * inter_size, dtype=dtype, scale=3.0)
    got = silu_and_mul_triton(x)
    assert got.shape == (3, inter_size) and got.dtype == dtype
    torch.testing.assert_close(got, silu_and_mul_torch(x), **tolerance(dtype))


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
