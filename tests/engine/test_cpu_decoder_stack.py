"""The decoder stack in one C call (engine/runner/cpu_decoder_stack.py) against the layers' own
Python forward: the same kernels in the same order, so the same tokens and the same logprobs
bit for bit, for plain decode and for DSpark (verify windows, and the residual streams the
drafter captures), in fp32 and bf16, on whichever linear kernel this CPU builds (the AMX tiles,
or gemv.c's vector path for its ISA). Prefill chunks, longer than the C attention kernel takes,
stay in Python. The embedded SmolLM2 in fp32 gives transformers' greedy tokens with the stack
serving its decode steps."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.kernels.cpu import gemm, gemv
from engine.loader.load import load_model
from engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.runner.cpu_decoder_stack import CpuDecoderStack
from engine.sampling_params import SamplingParams
from tests.engine.conftest import SHORT_PROMPTS, tiny_drafter_or_none
from tests.engine.engine_driver import chat_ids, run

needs_kernels = pytest.mark.skipif(
    not (gemv.available() or gemm.available()), reason="no C compiler: the linear kernels cannot be built"
)


def _engine(model_dir: Path, drafter: Path | None, dtype: str = "bfloat16") -> EngineCore:
    spec = SpeculativeConfig(drafter=str(drafter)) if drafter is not None else None
    config = EngineConfig(
        model=str(model_dir), device="cpu", dtype=dtype, max_model_len=512, kv_cache_memory_bytes=64 << 20,
        speculative=spec,
    )  # fmt: skip
    return EngineCore(config)


@needs_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_one_call_stack_serves_the_python_layers_tokens(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, speculative: bool, dtype: str
):
    drafter = tiny_drafter_or_none(tiny_model_dir, tmp_path / "drafter", speculative)
    prompts = SHORT_PROMPTS
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)

    served = {"stack": 0, "python": 0}
    serves = CpuDecoderStack.serves

    def counting(self: CpuDecoderStack, hidden: torch.Tensor, ctx) -> bool:
        taken = serves(self, hidden, ctx)
        served["stack" if taken else "python"] += 1
        return taken

    monkeypatch.setattr(CpuDecoderStack, "serves", counting)
    one_call = run(_engine(tiny_model_dir, drafter, dtype), prompts, params)
    assert served["stack"] > 20 and served["python"] >= 1  # decode/verify steps; the prefill
    monkeypatch.setattr(CpuDecoderStack, "serves", lambda self, hidden, ctx: False)
    python = run(_engine(tiny_model_dir, drafter, dtype), prompts, params)
    assert [f.token_ids for f in one_call] == [f.token_ids for f in python]
    for a, b in zip(one_call, python, strict=True):
        assert [o.new_logprobs for o in a.outputs] == [o.new_logprobs for o in b.outputs]


def test_stack_declines_what_it_cannot_run(tiny_model_dir: Path):
    loaded = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu", progress=False)
    layers = cast(LlamaForCausalLM, loaded.model).model.layers
    stack = CpuDecoderStack([cast(LlamaDecoderLayer, layer) for layer in layers], loaded.config)
    assert not stack.runs_weights()  # dense weights: nothing packed for our kernels


@needs_kernels
@pytest.mark.slow
def test_embedded_smollm2_in_fp32_gives_transformers_greedy_tokens():
    """The engine as `make serve` runs it on CPU (fp32, every kernel, the stack serving decode)
    against transformers' greedy decoding of the same weights and prompts. Both sum in fp32 in
    other orders, so a near tie could flip a token; these prompts have none within 24 tokens."""
    from transformers import AutoModelForCausalLM

    from engine.loader.resolve import resolve_model

    engine = EngineCore(EngineConfig(model="smollm2-135m", device="cpu", dtype="float32", max_model_len=512))
    served = {"stack": 0}
    serves = CpuDecoderStack.serves

    def counting(self: CpuDecoderStack, hidden: torch.Tensor, ctx) -> bool:
        taken = serves(self, hidden, ctx)
        served["stack"] += taken
        return taken

    questions = ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.")
    prompts = [chat_ids(engine, [{"role": "user", "content": text}]) for text in questions]
    params = SamplingParams(max_tokens=24, temperature=0.0)  # both stop at EOS
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CpuDecoderStack, "serves", counting)
        ours = [f.token_ids for f in run(engine, prompts, params)]
    assert served["stack"] >= 8
    source = resolve_model("smollm2-135m")  # the embedded GGUF, dequantised to fp32 by both
    reference = AutoModelForCausalLM.from_pretrained(
        str(source.path.parent), gguf_file=source.path.name, torch_dtype=torch.float32
    )
    for prompt, tokens in zip(prompts, ours, strict=True):
        ids = torch.tensor([prompt])
        expected = reference.generate(ids, max_new_tokens=24, do_sample=False)[0, len(prompt) :].tolist()
        common = min(len(tokens), len(expected))  # one may count the EOS token, the other not
        assert common >= 8 and tokens[:common] == expected[:common]
