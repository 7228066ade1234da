"""CPU linears with packed weights (engine.kernels.cpu.linear): oneDNN-packed ones compute
exactly what F.linear computes, the AMX tile kernel computes it to bf16 rounding (its fp32 sum
runs in another order); packing leaves float32 alone, unties a tied LM head without touching
the embedding, and serves the same tokens as dense weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.engine_setup import build_engine_parts
from engine.kernels.activation import silu_and_mul_torch
from engine.kernels.cpu import gemm
from engine.kernels.cpu import linear as cpu_linear
from engine.loader.load import load_model
from engine.sampling_params import SamplingParams
from tests.engine.conftest import SHORT_PROMPTS, tiny_drafter_or_none
from tests.engine.engine_driver import run

pytestmark = pytest.mark.skipif(
    not cpu_linear.cpu_packing_supported(torch.bfloat16),
    reason="this CPU or torch build cannot pack bf16 weights for oneDNN",
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_packed_linear_is_bit_identical_to_f_linear(dtype, rows, with_bias):
    if not cpu_linear.cpu_packing_supported(dtype):
        pytest.skip(f"{dtype} packing is not supported here")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(dtype)  # K = 80: not a shape for the AMX kernel
    bias = torch.randn(96, generator=gen).to(dtype) if with_bias else None
    x = torch.randn(rows, 80, generator=gen).to(dtype)
    packed = cpu_linear.pack_weight(weight)
    assert packed.is_mkldnn and packed.shape == weight.shape and packed.dtype == dtype
    assert torch.equal(cpu_linear.linear(x, packed, bias), F.linear(x, weight, bias))
    # leading dims and a stride-0 view: the rows of the 2-D product (F.linear itself rounds a
    # 3-D input's bias add separately, so it is not the reference there)
    batched = x.view(1, rows, 80).expand(2, rows, 80)
    expected = F.linear(x, weight, bias).expand(2, rows, 96)
    assert torch.equal(cpu_linear.linear(batched, packed, bias), expected)


needs_amx = pytest.mark.skipif(not gemm.available(), reason="no AMX-BF16 tile kernel on this CPU")


def _rounding_of(reference: torch.Tensor) -> torch.Tensor:
    """Half a bf16 step of each value of an fp32 reference, plus the slack an fp32 sum taken in
    another order can add before rounding."""
    return reference.abs() * 2.0**-8 + reference.abs().max() * 2.0**-16


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33, 40])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(64, 32), (96, 576), (32, 1536)], ids=str)
def test_amx_linear_rounds_the_exact_product(rows, with_bias, shape):
    gen = torch.Generator().manual_seed(rows + shape[1])
    n, k = shape
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    x = torch.randn(rows, k, generator=gen).bfloat16()
    packed = cpu_linear.pack_weight(weight)
    assert gemm.is_packed(packed) and packed.shape == (n // 32, k // 2, 32, 2)
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    got = cpu_linear.linear(x, packed, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    # within a bf16 rounding of the exact product: what F.linear's fp32 sum also gives
    assert ((got.double() - exact).abs() <= _rounding_of(exact) * 2).all()
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=2**-7, atol=1e-2)
    # leading dims, rows taken with a stride (every other row of a wider tensor)
    wide = torch.randn(rows, 2 * k, generator=gen).bfloat16()
    strided = wide[:, :k]
    expected = cpu_linear.linear(strided.contiguous(), packed, bias)
    assert torch.equal(cpu_linear.linear(strided.view(1, rows, k), packed, bias)[0], expected)
    assert cpu_linear.linear(x[:0], packed, bias).shape == (0, n)


@needs_amx
def test_amx_packing_takes_only_what_it_can():
    assert gemm.supports(torch.zeros(64, 64, dtype=torch.bfloat16))
    assert not gemm.supports(torch.zeros(64, 80, dtype=torch.bfloat16))  # K not a multiple of 32
    assert not gemm.supports(torch.zeros(48, 64, dtype=torch.bfloat16))  # N not a multiple of 32
    assert not gemm.supports(torch.zeros(64, 64, dtype=torch.float16))
    assert cpu_linear.pack_weight(torch.zeros(48, 64, dtype=torch.bfloat16)).is_mkldnn  # oneDNN takes it
    packed = cpu_linear.pack_weight(torch.zeros(64, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="does not fit"):
        cpu_linear.linear(torch.zeros(2, 32, dtype=torch.bfloat16), packed)


def test_kernels_switched_off_by_name(monkeypatch: pytest.MonkeyPatch):
    from engine.kernels.cpu import build

    monkeypatch.setenv("DSPARK_CPU_KERNELS", "attention, elementwise")
    assert build.enabled("attention") and build.enabled("elementwise") and not build.enabled("gemm")
    monkeypatch.setenv("DSPARK_CPU_KERNELS", "off")
    assert not build.enabled("attention")
    monkeypatch.setenv("DSPARK_CPU_KERNELS", "1")
    assert build.enabled("gemm")


def test_dense_weight_takes_f_linear():
    weight, x = torch.randn(8, 4), torch.randn(3, 4)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))


def test_float32_weights_stay_dense(tiny_model_dir: Path):
    loaded = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu", progress=False)
    assert cpu_linear.pack_module_weights(loaded.model, torch.float32) == 0
    assert not any(cpu_linear.is_packed(p) for p in loaded.model.parameters())


def test_packing_unties_the_lm_head_and_keeps_logits(tiny_model_dir: Path):
    dense = load_model(str(tiny_model_dir), dtype=torch.bfloat16, device="cpu", progress=False).model
    packed = load_model(str(tiny_model_dir), dtype=torch.bfloat16, device="cpu", progress=False).model
    # 2 layers x (qkv, o, gate_up, down) + the LM head
    assert cpu_linear.pack_module_weights(packed, torch.bfloat16) == 9
    assert cpu_linear.pack_module_weights(packed, torch.bfloat16) == 0  # already packed
    assert cpu_linear.is_packed(packed.lm_head.weight)
    assert not cpu_linear.is_packed(packed.model.embed_tokens.weight)  # the embedding keeps its table
    assert torch.equal(packed.model.embed_tokens.weight, dense.model.embed_tokens.weight)
    hidden = torch.randn(7, dense.config.hidden_size).to(torch.bfloat16)
    # bit for bit through oneDNN; to bf16 rounding through the AMX kernel
    torch.testing.assert_close(packed.compute_logits(hidden), dense.compute_logits(hidden), rtol=2**-7, atol=1e-2)


def _engine(model_dir: Path, pack: bool, monkeypatch: pytest.MonkeyPatch, drafter: Path | None = None) -> EngineCore:
    loaded = load_model(str(model_dir), dtype=torch.bfloat16, device="cpu", progress=False)
    if not pack:
        monkeypatch.setattr("engine.engine_setup.pack_module_weights", lambda model, dtype: 0)
    spec = SpeculativeConfig(drafter=str(drafter)) if drafter is not None else None
    config = EngineConfig(
        model=str(model_dir),
        device="cpu",
        dtype="bfloat16",
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        speculative=spec,
    )
    engine = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
    monkeypatch.undo()
    assert any(cpu_linear.is_packed(p) for p in loaded.model.parameters()) == pack
    if engine.parts.spec is not None:
        assert any(cpu_linear.is_packed(p) for p in engine.parts.spec.drafter.parameters()) == pack
    return engine


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_packed_engine_serves_the_dense_engines_tokens(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, speculative: bool
):
    drafter = tiny_drafter_or_none(tiny_model_dir, tmp_path / "drafter", speculative)
    prompts = SHORT_PROMPTS
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
    dense = run(_engine(tiny_model_dir, False, monkeypatch, drafter), prompts, params)
    packed = run(_engine(tiny_model_dir, True, monkeypatch, drafter), prompts, params)
    assert [f.token_ids for f in packed] == [f.token_ids for f in dense]
    for p, d in zip(packed, dense, strict=True):
        assert [o.new_logprobs for o in p.outputs] == [o.new_logprobs for o in d.outputs]


@needs_amx
@pytest.mark.parametrize("rows", [1, 16, 21])
@pytest.mark.parametrize("with_bias", [False, True])
def test_amx_swiglu_matches_linear_then_silu_and_mul(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    inter, k = 48, 64
    weight = torch.randn(2 * inter, k, generator=gen).bfloat16()  # [gate | up]
    bias = torch.randn(2 * inter, generator=gen).bfloat16() if with_bias else None
    x = torch.randn(rows, k, generator=gen).bfloat16()
    gated = cpu_linear.pack_weight(weight, gated=True)
    assert gemm.is_packed_gated(gated) and gated.shape == (inter // 16, k // 2, 2, 16, 2)
    plain = cpu_linear.pack_weight(weight)
    # the same sums, rounded where the linear, silu and the product round: equal bit for bit
    expected = silu_and_mul_torch(cpu_linear.linear(x, plain, bias))
    assert torch.equal(cpu_linear.linear_swiglu(x, gated, bias), expected)
    # and every other weight takes the linear, then silu_and_mul
    assert torch.equal(cpu_linear.linear_swiglu(x, weight, bias), silu_and_mul_torch(F.linear(x, weight, bias)))
