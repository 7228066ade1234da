"""The decoder stack in one C call (engine/runner/cpu_decoder_stack.py) against the layers' own
Python forward: the same kernels in the same order, so the same tokens and the same logprobs
bit for bit, for plain decode and for DSpark (verify windows, and the residual streams the
drafter captures). Prefill chunks, longer than the C attention kernel takes, stay in Python.
The stack serves only on the AMX tile kernel; without it (this CPU, or DSPARK_CPU_ISA below
amx) what remains to test is that it declines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.kernels.cpu import gemm
from engine.loader.load import load_model
from engine.runner.cpu_decoder_stack import CpuDecoderStack
from engine.sampling_params import SamplingParams
from tests.engine.conftest import SHORT_PROMPTS, tiny_drafter_or_none
from tests.engine.engine_driver import run

needs_amx = pytest.mark.skipif(
    not gemm.available(), reason="no AMX-BF16 tile kernel (this CPU, or DSPARK_CPU_ISA): the stack never serves"
)


def _engine(model_dir: Path, drafter: Path | None) -> EngineCore:
    spec = SpeculativeConfig(drafter=str(drafter)) if drafter is not None else None
    config = EngineConfig(
        model=str(model_dir), device="cpu", dtype="bfloat16", max_model_len=512, kv_cache_memory_bytes=64 << 20,
        speculative=spec,
    )  # fmt: skip
    return EngineCore(config)


@needs_amx
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_one_call_stack_serves_the_python_layers_tokens(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, speculative: bool
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
    one_call = run(_engine(tiny_model_dir, drafter), prompts, params)
    assert served["stack"] > 20 and served["python"] >= 1  # decode/verify steps; the prefill
    monkeypatch.setattr(CpuDecoderStack, "serves", lambda self, hidden, ctx: False)
    python = run(_engine(tiny_model_dir, drafter), prompts, params)
    assert [f.token_ids for f in one_call] == [f.token_ids for f in python]
    for a, b in zip(one_call, python, strict=True):
        assert [o.new_logprobs for o in a.outputs] == [o.new_logprobs for o in b.outputs]


def test_stack_declines_what_it_cannot_run(tiny_model_dir: Path):
    loaded = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu", progress=False)
    stack = CpuDecoderStack(list(loaded.model.model.layers), loaded.config)
    assert not stack.runs_weights()  # float32: nothing packed for the tile kernel
