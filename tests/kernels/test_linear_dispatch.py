"""engine/kernels/linear.py off the skinny kernel's path (a CPU, or more than one row): a
projection handed its layer's RMSNorm is that norm followed by the projection, and returns
the residual stream the layer carries on. The kernel's own path is tested against the same
references in tests/kernels/triton/skinny_linear_cases.py and on a GPU in
tests/models/test_parity_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.linear import RowNorm, norm_linear, takes_skinny_kernel

K, N_OUT, EPS = 64, 48, 1e-6


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["first-layer", "residual"])
@pytest.mark.parametrize("rows", [1, 3])
def test_norm_linear_is_the_norm_then_the_projection(gated, with_residual, rows):
    gen = torch.Generator().manual_seed(rows + 2 * gated + 4 * with_residual)
    x = torch.randn(rows, K, generator=gen)
    residual = torch.randn(rows, K, generator=gen) if with_residual else None
    norm_weight = torch.rand(K, generator=gen) + 0.5
    weight = torch.randn(2 * N_OUT if gated else N_OUT, K, generator=gen) / K**0.5
    bias = torch.randn(weight.shape[0], generator=gen)

    y, stream = norm_linear(x, RowNorm(norm_weight, EPS, residual), weight, bias, gated=gated)

    expected_stream = x + residual if residual is not None else x
    normed = expected_stream * torch.rsqrt(expected_stream.pow(2).mean(-1, keepdim=True) + EPS) * norm_weight
    expected = F.linear(normed, weight, bias)
    if gated:
        expected = F.silu(expected[:, :N_OUT]) * expected[:, N_OUT:]
    assert stream.shape == x.shape and y.shape == (rows, N_OUT)
    torch.testing.assert_close(stream, expected_stream)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_cpu_tensors_never_take_the_skinny_kernel():
    x, weight = torch.randn(1, K, dtype=torch.bfloat16), torch.randn(N_OUT, K, dtype=torch.bfloat16)
    assert not takes_skinny_kernel(x, weight)
