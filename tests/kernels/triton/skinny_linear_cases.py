"""The skinny linear kernel (a few rows against a weight: decode) against F.linear, plain and
gated (then silu_and_mul), and its norm form against RMSNorm (with and without the residual
add) then the linear, at small shapes: interpreted on CPU, compiled on a GPU.

Not collected by a plain `pytest` run (the name lacks `test_`): test_skinny_linear.py runs it
in a child process with TRITON_INTERPRET=1 (tests/triton_interpreter.py says why), and on a
GPU machine compiled. Run it directly with
`TRITON_INTERPRET=1 python -m pytest tests/kernels/triton/skinny_linear_cases.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import DTYPES, assert_rounded_like, linear_reference, linear_tolerance, randn

from engine.kernels.norm import add_rms_norm_torch, rms_norm_torch
from engine.kernels.triton.skinny_linear import RowNorm, SkinnyConfig, skinny_linear_triton, skinny_norm_linear_triton
from tests.triton_interpreter import require_interpreter

if not torch.cuda.is_available():
    require_interpreter()

SMALL_CONFIGS = [SkinnyConfig(8, 32, 2, True), SkinnyConfig(16, 64, 4, False)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("in_features", [96, 64])  # K not a multiple of BLOCK_K, and a multiple
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=["wide", "step"])
def test_matches_linear(
    dtype: torch.dtype, rows: int, in_features: int, gated: bool, config: SkinnyConfig, gen: torch.Generator
) -> None:
    out_features = 40  # not a multiple of BLOCK_N: the last program is partial
    x = randn(gen, rows, in_features, dtype=dtype)
    w = randn(gen, 2 * out_features if gated else out_features, in_features, dtype=dtype, scale=in_features**-0.5)
    bias = randn(gen, w.shape[0], dtype=dtype, scale=0.1)
    got = skinny_linear_triton(x, w, bias, gated=gated, config=config)
    assert got.shape == (rows, out_features) and got.dtype == dtype
    torch.testing.assert_close(got, linear_reference(x, w, bias, gated), **linear_tolerance(dtype, in_features))


def test_leading_dims_strided_rows_and_no_bias(gen: torch.Generator) -> None:
    wide = randn(gen, 2, 2, 80)
    x = wide[..., :64]  # rows of stride 80
    w = randn(gen, 24, 64, scale=0.125)
    got = skinny_linear_triton(x, w)
    assert got.shape == (2, 2, 24)
    torch.testing.assert_close(got, F.linear(x, w), **linear_tolerance(torch.float32, 64))


def test_bad_shapes_are_rejected(gen: torch.Generator) -> None:
    with pytest.raises(ValueError, match="expects 32"):
        skinny_linear_triton(randn(gen, 1, 16), randn(gen, 8, 32))
    with pytest.raises(ValueError, match="even row count"):
        skinny_linear_triton(randn(gen, 1, 16), randn(gen, 7, 16), gated=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=["wide", "step"])
def test_norm_form_matches_norm_then_linear(
    dtype: torch.dtype, rows: int, with_residual: bool, gated: bool, config: SkinnyConfig, gen: torch.Generator
) -> None:
    in_features, out_features, eps = 96, 40, 1e-5
    x = randn(gen, rows, in_features, dtype=dtype, scale=2.0)
    residual = randn(gen, rows, in_features, dtype=dtype, scale=4.0) if with_residual else None
    norm_weight = randn(gen, in_features, dtype=dtype, scale=0.2) + 1
    w = randn(gen, 2 * out_features if gated else out_features, in_features, dtype=dtype, scale=in_features**-0.5)
    got, stream = skinny_norm_linear_triton(x, RowNorm(norm_weight, eps, residual), w, gated=gated, config=config)
    if residual is None:
        normed, expected_stream = rms_norm_torch(x, norm_weight, eps), x
    else:
        normed, expected_stream = add_rms_norm_torch(x, residual, norm_weight, eps)
    assert_rounded_like(stream, expected_stream)
    # the rows' mean square may sum in another order than the norm's: an ulp of the
    # normalised input at most, which the product spreads over K terms
    tolerance = linear_tolerance(dtype, in_features)
    torch.testing.assert_close(
        got, linear_reference(normed, w, None, gated), rtol=2 * tolerance["rtol"], atol=2 * tolerance["atol"]
    )
