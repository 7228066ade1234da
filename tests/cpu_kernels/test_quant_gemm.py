"""The quantized linear and embedding kernels (engine/kernels/cpu/quant_gemm.c) against their
torch references (gguf.quants' dequantisation, then F.linear / F.embedding) on fresh random
blocks. `make test-isa` runs them again at each DSPARK_CPU_ISA level below this CPU's.

The dequantised rows are equal bit for bit: each weight is d * q (+ m), and d * q is exact in
fp32, so the kernel's rounding is the reference's. The products differ in the order of their
fp32 sums only; any order of a K-term dot product is within gamma_K = K u / (1 - K u) of the
exact value relative to sum |x_k w_k| (Higham, Accuracy and Stability of Numerical Algorithms,
eq. 3.5; u = 2^-24), so kernel and reference are within twice that of each other (one more
term for the bias).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernels.cpu import gemv, isa, quant_gemm
from engine.kernels.cpu.quant_gemm import FORMATS, dequantize_torch, embedding_q, linear_q, linear_q_torch

pytestmark = pytest.mark.skipif(not quant_gemm.available(), reason="no C compiler: the kernels cannot be built")
UNIT_ROUNDOFF = 2.0**-24


def random_blocks(fmt: str, n: int, k: int, gen: np.random.Generator) -> torch.Tensor:
    """A random [n, row_bytes] weight in `fmt`: every quant value drawn, scales (and Q4_1's
    minimum) of a trained model's magnitude, stored as fp16 as GGUF stores them."""
    blocks = n * k // 32
    if fmt == "Q8_0":
        scale = (np.abs(gen.standard_normal((blocks, 1))) * 1e-3).astype(np.float16)
        quants = gen.integers(-128, 128, (blocks, 32), dtype=np.int8)
        raw = np.concatenate([scale.view(np.uint8), quants.view(np.uint8)], axis=1)
    else:
        scale = (np.abs(gen.standard_normal((blocks, 1))) * 1e-2).astype(np.float16)
        minimum = (-8 * scale.astype(np.float32) * (1 + 0.1 * gen.standard_normal((blocks, 1)))).astype(np.float16)
        nibbles = gen.integers(0, 256, (blocks, 16), dtype=np.uint8)
        raw = np.concatenate([scale.view(np.uint8), minimum.view(np.uint8), nibbles], axis=1)
    return torch.from_numpy(np.ascontiguousarray(raw.reshape(n, -1)))


def assert_within_summation_order(got: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, k: int):
    """|got - expected| <= 2 gamma_{k+1} * magnitude (sum of |x_k w_k|, plus |bias|)."""
    gamma = (k + 1) * UNIT_ROUNDOFF / (1 - (k + 1) * UNIT_ROUNDOFF)
    excess = (got - expected).abs() - 2 * gamma * magnitude
    assert excess.max() <= 0, f"max error beyond the bound: {excess.max().item():.3e}"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 3, 16, 70])  # decode row, few-rows tails, a decode batch, prefill panels
@pytest.mark.parametrize(("n", "k"), [(37, 32), (192, 576), (64, 1536)])
def test_linear_matches_the_dequantised_reference(fmt: str, m: int, n: int, k: int, seed: int):
    gen = np.random.default_rng(seed)
    weight = random_blocks(fmt, n, k, gen)
    wide = torch.from_numpy(gen.standard_normal((m, k + 16), dtype=np.float32))
    x = wide[:, 16:]  # strided rows, as the model's views are
    bias = torch.from_numpy(gen.standard_normal(n, dtype=np.float32))
    for b in (None, bias):
        got = linear_q(x, weight, fmt, b)
        expected = linear_q_torch(x, weight, fmt, b)
        magnitude = x.abs() @ dequantize_torch(weight, fmt).abs().T + (0 if b is None else b.abs())
        assert got.shape == (m, n) and got.dtype == torch.float32
        assert_within_summation_order(got, expected, magnitude, k)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n", [37, 576])  # a tail panel of output features, and none
@pytest.mark.parametrize("m", [5, 16, 70])  # past every build's few-rows count: a row-block tail, decode, prefill
def test_many_rows_equal_the_fp32_kernel_on_the_dequantised_weight_bit_for_bit(fmt: str, n: int, m: int, seed: int):
    """More than a few rows (prefill, batched decode) dequantise each panel of 32 output
    features into gemv.c's fp32 layout and multiply it by gemv.c's own panel product
    (vector.h): the float32 engine's result on the dequantised weight, bit for bit, bias
    included. The portable build's plain vector arithmetic may be reassociated by the
    compiler (-fassociative-math): there, the summation-order bound."""
    gen = np.random.default_rng(seed)
    weight = random_blocks(fmt, n, 576, gen)
    padded = torch.zeros(-(-n // gemv.PANEL) * gemv.PANEL, 576)  # gemv packs whole panels
    padded[:n] = dequantize_torch(weight, fmt)
    x = torch.from_numpy(gen.standard_normal((m, 576), dtype=np.float32))
    bias = torch.zeros(padded.shape[0])
    bias[:n] = torch.from_numpy(gen.standard_normal(n, dtype=np.float32))
    got = linear_q(x, weight, fmt, bias[:n])
    expected = gemv.linear(x, gemv.pack(padded), bias)[:, :n]
    if isa.target().level == "portable":
        magnitude = x.abs() @ padded[:n].abs().T + bias[:n].abs()
        assert_within_summation_order(got, expected, magnitude, 576)
    else:
        assert torch.equal(got, expected)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_linear_writes_into_a_column_slice(fmt: str, seed: int):
    """A fused projection of parts in different formats writes each part into its columns."""
    gen = np.random.default_rng(seed)
    weight = random_blocks(fmt, 40, 64, gen)
    x = torch.from_numpy(gen.standard_normal((5, 64), dtype=np.float32))
    out = torch.full((5, 100), 7.0)
    linear_q(x, weight, fmt, out=out[:, 30:70])
    assert torch.equal(out[:, :30], torch.full((5, 30), 7.0)) and torch.equal(out[:, 70:], torch.full((5, 30), 7.0))
    torch.testing.assert_close(out[:, 30:70], linear_q(x, weight, fmt), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_batched_input_keeps_its_leading_dims(fmt: str, seed: int):
    gen = np.random.default_rng(seed)
    weight = random_blocks(fmt, 8, 64, gen)
    x = torch.from_numpy(gen.standard_normal((2, 3, 64), dtype=np.float32))
    assert torch.equal(linear_q(x, weight, fmt), linear_q(x.reshape(6, 64), weight, fmt).view(2, 3, 8))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("count", [1, 7, 300])  # one decode token, a few, a threaded prefill
def test_embedding_rows_equal_the_reference_bit_for_bit(fmt: str, count: int, seed: int):
    gen = np.random.default_rng(seed)
    weight = random_blocks(fmt, 500, 576, gen)
    ids = torch.from_numpy(gen.integers(0, 500, count))
    got = embedding_q(ids, weight, fmt)
    assert torch.equal(got, quant_gemm.embedding_q_torch(ids, weight, fmt))
    assert torch.equal(embedding_q(ids.view(1, -1), weight, fmt), got.view(1, count, 576))


def test_bad_inputs_are_refused():
    weight = torch.zeros(4, 40, dtype=torch.uint8)  # two Q4_1 blocks a row: K = 64
    with pytest.raises(ValueError, match="K = 64"):
        linear_q(torch.zeros(1, 32), weight, "Q4_1")
    with pytest.raises(ValueError, match="bfloat16"):
        linear_q(torch.zeros(1, 64, dtype=torch.bfloat16), weight, "Q4_1")
    with pytest.raises(ValueError, match="uint8"):
        linear_q(torch.zeros(1, 64), torch.zeros(4, 41, dtype=torch.uint8), "Q4_1")
