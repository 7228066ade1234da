"""CPU linears with packed weights (engine.kernels.cpu.linear): oneDNN-packed ones and the AMX
tile kernel compute the product to bf16 rounding, as F.linear does (their fp32 sums run in
other orders, which depend on the ISA oneDNN picks on this CPU, so they need not equal
F.linear bit for bit); packing leaves float32 alone, unties a tied LM head without touching
the embedding, and serves the dense engine's tokens up to near ties, with its logprobs to bf16
rounding. float32 weights pack for the vector kernel of gemv.c (tests/cpu_kernels/test_cpu_gemv.py)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.engine_setup import build_engine_parts
from engine.kernels.activation import silu_and_mul
from engine.kernels.cpu import elementwise as cpu_elementwise
from engine.kernels.cpu import gemm, gemv
from engine.kernels.cpu import linear as cpu_linear
from engine.loader.load import load_model
from engine.models.llama import LlamaForCausalLM
from engine.sampling_params import SamplingParams
from tests.engine.conftest import SHORT_PROMPTS, tiny_drafter_or_none
from tests.engine.engine_driver import Finished, run

pytestmark = pytest.mark.skipif(
    not cpu_linear.cpu_packing_supported(torch.bfloat16),
    reason="this CPU or torch build cannot pack bf16 weights for oneDNN",
)


def _rounding_of(reference: torch.Tensor) -> torch.Tensor:
    """Half a bf16 step of each value of an fp32 reference, plus the slack an fp32 sum taken in
    another order can add before rounding."""
    return reference.abs() * 2.0**-8 + reference.abs().max() * 2.0**-16


def _exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.double() @ weight.double().T + (0 if bias is None else bias.double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_packed_linear_rounds_the_exact_product(dtype, rows, with_bias):
    if not cpu_linear.onednn_packing_supported(dtype):
        pytest.skip(f"oneDNN does not pack {dtype} here")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(88, 80, generator=gen).to(dtype)  # N = 88: not a shape for our kernels
    bias = torch.randn(88, generator=gen).to(dtype) if with_bias else None
    x = torch.randn(rows, 80, generator=gen).to(dtype)
    packed = cpu_linear.pack_weight(weight)
    assert packed.is_mkldnn and packed.shape == weight.shape and packed.dtype == dtype
    exact = _exact(x, weight, bias)
    got = cpu_linear.linear(x, packed, bias)
    assert got.dtype == dtype and got.shape == (rows, 88)
    # within a rounding of the exact product (fp16 has 3 more bits: the bf16 bound holds)
    assert ((got.double() - exact).abs() <= _rounding_of(exact) * 2).all()
    # leading dims and a stride-0 view: the rows of the 2-D product, to the same rounding
    batched = cpu_linear.linear(x.view(1, rows, 80).expand(2, rows, 80), packed, bias)
    assert batched.shape == (2, rows, 88)
    assert ((batched.double() - exact).abs() <= _rounding_of(exact) * 2).all()


needs_amx = pytest.mark.skipif(not gemm.available(), reason="no AMX-BF16 tile kernel (this CPU, or DSPARK_CPU_ISA)")


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
    exact = _exact(x, weight, bias)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_table_is_held_once_and_keeps_embeddings_and_logits(tiny_model_dir: Path, dtype: torch.dtype):
    dense, packed = (
        cast(LlamaForCausalLM, load_model(str(tiny_model_dir), dtype=dtype, device="cpu", progress=False).model)
        for _ in range(2)
    )
    if not cpu_linear.cpu_packing_supported(dtype):
        pytest.skip(f"{dtype} weights are not packed here")
    # 2 layers x (qkv, o, gate_up, down) + the LM head
    assert cpu_linear.pack_module_weights(packed, dtype) == 9
    assert cpu_linear.pack_module_weights(packed, dtype) == 0  # already packed
    head = packed.lm_head.weight
    if dtype == torch.float32:
        assert cpu_linear.kernel_of(head) == "gemv"  # fp32 has no other kernel of ours
    if gemv.is_packed(head):  # our panels: the embedding looks its rows up in the head's packing
        assert packed.model.embed_tokens.weight is head
    else:  # oneDNN's opaque layout: the embedding keeps its own table
        assert torch.equal(packed.model.embed_tokens.weight, dense.model.embed_tokens.weight)
    ids = torch.arange(dense.config.vocab_size).view(4, -1)  # every row, in a 2-D batch
    assert torch.equal(packed.model.embed_tokens(ids), dense.model.embed_tokens(ids))
    hidden = torch.randn(7, dense.config.hidden_size).to(dtype)
    # to bf16 rounding: oneDNN and our kernels sum in other orders than F.linear
    rtol, atol = (2**-7, 1e-2) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    torch.testing.assert_close(packed.compute_logits(hidden), dense.compute_logits(hidden), rtol=rtol, atol=atol)


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
    compared = sum(_same_greedy_run(p, d) for p, d in zip(packed, dense, strict=True))
    assert compared >= len(prompts)  # at least every first token


# Packed and dense weights go through different kernels (oneDNN's packed primitive or the AMX
# tile kernel, against F.linear), whose fp32 sums run in orders that depend on the ISA picked
# on this CPU. A bf16 output whose sum lies near a rounding boundary then lands one bf16 step
# (2^-7 of its magnitude at most) from the dense one. The tiny model's logits stay below 8 in
# magnitude (about 6.3 on the short prompts), where a step is 2^-5: a logprob (logit -
# logsumexp) moves by a step of its own logit and one through the logsumexp, and the hidden
# states' steps, carried through both layers, move the logits by about as much again.
LOGPROB_TOLERANCE = 4 * 2.0**-5


def _same_greedy_run(packed: Finished, dense: Finished) -> int:
    """Asserts that two greedy runs of one request agree to LOGPROB_TOLERANCE: the k-th best
    logprob of each position (which moves no more than the logprobs do), and the token while
    the dense run's best two are farther apart than twice the tolerance. At a nearer tie (the
    tiny model has exact ones) either token may win, and the runs may go on differently from
    there. Returns the positions compared."""
    packed_steps = [lp for o in packed.outputs for lp in o.new_logprobs]
    dense_steps = [lp for o in dense.outputs for lp in o.new_logprobs]
    for position, (p, d) in enumerate(zip(packed_steps, dense_steps, strict=False)):
        # greedy: the token has the best logprob (at an exact tie, not always top[0]'s token)
        assert len(p.top) == len(d.top) == 2 and p.logprob == p.top[0][1] and d.logprob == d.top[0][1]
        for (_, got), (_, expected) in zip(p.top, d.top, strict=True):
            assert abs(got - expected) <= LOGPROB_TOLERANCE, (position, p, d)
        if p.token_id != d.token_id:
            assert d.top[0][1] - d.top[1][1] <= 2 * LOGPROB_TOLERANCE, (position, p, d)
            return position + 1
    assert packed.token_ids == dense.token_ids
    return len(dense_steps)


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
    # the same sums, rounded where the linear, the C kernel's silu (exp_approx, the same
    # operations in the same order) and the product round: equal bit for bit
    expected = cpu_elementwise.silu_and_mul(cpu_linear.linear(x, plain, bias))
    assert torch.equal(cpu_linear.linear_swiglu(x, gated, bias), expected)
    # and every other weight takes the linear, then the dispatched silu_and_mul
    assert torch.equal(cpu_linear.linear_swiglu(x, weight, bias), silu_and_mul(F.linear(x, weight, bias)))
