"""Shared helpers of the kernel tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.kernels.activation import silu_and_mul_torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Standard normal (times scale) drawn from the CPU generator, then moved to DEVICE."""
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


def truncates_bf16(dtype: torch.dtype) -> bool:
    """Triton's interpreter (CPU) converts fp32 -> bf16 by truncation where compiled kernels
    round to nearest even as torch does, so interpreted bf16 results may sit an ulp or two
    off the reference; fp16 and fp32 conversions round correctly in both."""
    return DEVICE.type == "cpu" and dtype == torch.bfloat16


def close(dtype: torch.dtype, scale: float = 1.0) -> dict[str, Any]:
    """assert_close tolerances for results that may differ from the reference by an fp32
    reduction order (and, interpreted bf16, by truncation) at values of about `scale`."""
    if truncates_bf16(dtype):
        return {"rtol": 3e-2, "atol": 3e-2 * scale}
    return {}  # assert_close's defaults for the dtype


def assert_rounded_like(got: torch.Tensor, expected: torch.Tensor, scale: float = 1.0) -> None:
    """Bit-equal: the kernel repeats the reference's roundings (except interpreted bf16)."""
    if truncates_bf16(got.dtype):
        torch.testing.assert_close(got, expected, **close(got.dtype, scale))
    else:
        assert got.dtype == expected.dtype and torch.equal(got, expected), (got - expected).abs().max()


def linear_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """x W^T + b in fp32, rounded to x's dtype once (gated: then SwiGLU, rounding as it does)."""
    y = F.linear(x.float(), w.float(), None if bias is None else bias.float()).to(x.dtype)
    return silu_and_mul_torch(y) if gated else y


def linear_tolerance(dtype: torch.dtype, k: int) -> dict[str, float]:
    """Both sides sum K products in fp32 in different orders and round once to the dtype (the
    gated form rounds twice more, as the reference does): about an ulp of the dtype, more in
    the interpreter's truncating bf16 conversion."""
    eps = torch.finfo(dtype).eps
    scale = 4 if truncates_bf16(dtype) else 2
    return {"rtol": scale * eps, "atol": scale * eps + (1e-5 if dtype == torch.float32 else 0.0) * k**0.5}
