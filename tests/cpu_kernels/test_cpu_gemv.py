"""The vector linear kernels (engine/kernels/cpu/gemv.c) at every ISA level this CPU can build
(tests/cpu_kernels/conftest.py's `isa_level`: its own, each DSPARK_CPU_ISA cap below it, and
the portable C path), against the exact product in float64, and the elementwise and attention
kernels at each level against their torch references.

Bounds: every output column is an fp32 sum of K products taken in order (one FMA each; the
portable path rounds the product and the sum apart; vdpbf16ps adds a pair of exact bf16
products), so it lies within K * 2^-23 * sum_k |x_k w_k| of the exact value (the standard
bound for recursive summation, with room for both roundings per term), plus half a bf16 step
(2^-8 relative) where the output is bf16. The SwiGLU form is the plain product then
elementwise.c's silu_and_mul with the same roundings: equal bit for bit, by construction.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.kernels.cpu import elementwise, gemv, isa
from engine.kernels.cpu import linear as cpu_linear

pytestmark = pytest.mark.skipif(not gemv.available(), reason="no C compiler: the kernels cannot be built")
DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 2, 5, 6, 7, 16, 37]  # one decode row, row-block tails of every ISA, a batch, a chunk
# SmolLM2-135M: qkv (576 + 2 * 192), o, gate/up (2 x 1536), down; a tiny one; a k that ends in a
# short run (gemv.c takes panels in runs of 16 k)
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (64, 10), (320, 200)]


def assert_within_sum_bound(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    k = x.shape[-1]
    bound = k * 2.0**-23 * (x.double().abs() @ weight.double().abs().T) + 1e-30
    if got.dtype == torch.bfloat16:
        bound = bound + exact.abs() * 2.0**-8
    excess = (got.double() - exact).abs() - bound
    assert (excess <= 0).all(), f"off by {excess.max().item():.3g} past the bound"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_at_every_isa_level(isa_level: str, dtype: torch.dtype, shape: tuple[int, int], seed: int):
    if isa_level != "native":
        assert gemv.isa_name() == isa_level  # the build of the cap, not of the CPU
    gen = torch.Generator().manual_seed(seed)
    n, k = shape
    weight = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    packed = gemv.pack(weight)
    for rows in ROWS:
        wide = torch.randn(rows, 2 * k, generator=gen).to(dtype)
        x = wide[:, :k]  # strided rows
        got = gemv.linear(x, packed)
        assert got.dtype == dtype and got.shape == (rows, n)
        assert_within_sum_bound(got, x, weight, None)
        assert_within_sum_bound(gemv.linear(x, packed, bias), x, weight, bias)
        # the same rows alone give the same values: a row's sums do not depend on its block
        assert torch.equal(gemv.linear(x[-1:].contiguous(), packed), got[-1:])


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Restores torch's thread count, which the kernels take as theirs, after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# fewer than four panels per thread split the weight's k rows evenly, a panel between two threads
SPLIT_THREADS = [5, 12, 16, 17]


@pytest.mark.parametrize("shape", [(576, 576), (960, 576), (576, 1536)], ids=str)
def test_a_panel_split_between_threads_sums_as_one_thread_does(
    isa_level: str, shape: tuple[int, int], seed: int, torch_threads: None
):
    gen = torch.Generator().manual_seed(seed)
    n, k = shape
    weight = torch.randn(n, k, generator=gen)
    packed, gated = gemv.pack(weight), gemv.pack_gated(weight)
    for rows in range(1, 7):
        x = torch.randn(rows, 2 * k, generator=gen)[:, :k]
        torch.set_num_threads(1)
        plain, swiglu = gemv.linear(x, packed), gemv.linear_swiglu(x, gated)
        for threads in SPLIT_THREADS:
            torch.set_num_threads(threads)
            assert torch.equal(gemv.linear(x, packed), plain), f"{rows} rows on {threads} threads"
            assert torch.equal(gemv.linear_swiglu(x, gated), swiglu), f"{rows} rows on {threads} threads"


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_is_the_product_then_silu_and_mul(isa_level: str, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(3072, 576, generator=gen) * 0.1).to(dtype)
    bias = torch.randn(3072, generator=gen).to(dtype)
    gated, plain = gemv.pack_gated(weight), gemv.pack(weight)
    for rows in ROWS:
        x = torch.randn(rows, 576, generator=gen).to(dtype)
        for b in (None, bias):
            fused = gemv.linear_swiglu(x, gated, b)
            assert torch.equal(fused, elementwise.silu_and_mul(gemv.linear(x, plain, b)))


def test_packed_layouts_and_what_is_refused(isa_level: str):
    fp32, bf16 = torch.randn(64, 6), torch.randn(64, 6).bfloat16()
    assert gemv.pack(fp32).shape == (2, 6, 32) and gemv.pack(bf16).shape == (2, 3, 32, 2)
    assert gemv.pack_gated(fp32).shape == (2, 6, 2, 16) and gemv.pack_gated(bf16).shape == (2, 3, 2, 16, 2)
    assert not gemv.supports(torch.zeros(48, 6))  # N not a multiple of 32
    assert not gemv.supports(torch.zeros(64, 5, dtype=torch.bfloat16))  # odd K in bf16
    assert not gemv.supports(torch.zeros(64, 6, dtype=torch.float16))
    with pytest.raises(ValueError, match="does not fit"):
        gemv.linear(torch.zeros(2, 6, dtype=torch.bfloat16), gemv.pack(fp32))
    assert gemv.linear(torch.zeros(0, 6), gemv.pack(fp32)).shape == (0, 64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dispatch_packs_for_the_vector_kernel(dtype: torch.dtype, seed: int):
    """Where the AMX tiles are not there (or do not take the weight), linear.py packs fp32 and
    bf16 weights for gemv.c and runs them there; leading dims are the rows of the 2-D product."""
    gen = torch.Generator().manual_seed(seed)
    weight, x = torch.randn(96, 80, generator=gen).to(dtype), torch.randn(3, 5, 80, generator=gen).to(dtype)
    packed = cpu_linear.pack_weight(weight)  # K = 80: not a shape for the AMX kernel
    assert cpu_linear.kernel_of(packed) == "gemv" and cpu_linear.is_packed(packed)
    got = cpu_linear.linear(x, packed)
    assert got.shape == (3, 5, 96)
    assert torch.equal(got.view(15, 96), gemv.linear(x.view(15, 80), packed))
    assert cpu_linear.kernel_of(torch.randn(96, 80)) == "dense"


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_at_every_isa_level(isa_level: str, dtype: torch.dtype, seed: int):
    from engine.kernels.activation import silu_and_mul_torch
    from engine.kernels.norm import add_rms_norm_torch
    from engine.kernels.rope import rope_tables_torch, rotate_torch

    gen = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(16, 576, generator=gen).to(dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
    steps = 2 if dtype == torch.bfloat16 else 0  # the fp32 mean's order (test_cpu_elementwise.py)
    rtol, atol = max(steps * 2**-7, 2e-6), 2e-6
    for got, expected in zip(
        elementwise.add_rms_norm(x, residual, weight, 1e-5), add_rms_norm_torch(x, residual, weight, 1e-5), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    gate_up = (4 * torch.randn(16, 3072, generator=gen)).to(dtype)
    torch.testing.assert_close(elementwise.silu_and_mul(gate_up), silu_and_mul_torch(gate_up), rtol=rtol, atol=atol)
    q = torch.randn(16, 9, 64, generator=gen).to(dtype)
    cos, sin = rope_tables_torch(torch.arange(16), torch.randn(64, 64, generator=gen), dtype)
    torch.testing.assert_close(elementwise.rope(q, cos, sin), rotate_torch(q, cos, sin), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_at_every_isa_level(isa_level: str, dtype: torch.dtype, seed: int):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "attention"))
    from attention_cases import make_case, reference_attention, tolerance

    from engine.attention import TorchAttentionBackend

    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 200, (4,), generator=gen).tolist()
    case = make_case(seed, [1, 3, 8, 1], prefix, num_q_heads=9, num_kv_heads=3, head_dim=64, dtype=dtype)
    k_cache, v_cache = case.clone_caches()
    backend = TorchAttentionBackend(cpu_kernel=True)
    out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale)
    assert backend.cpu_kernel is not None and backend.cpu_kernel.built  # the C kernel took it
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(dtype))


def test_the_portable_level_builds_plain_c():
    assert isa.parse("portable") == isa.PORTABLE
    assert isa.resolve(isa.PORTABLE, "x86_64", isa.cpu_flags()).compile_flags() == ()
