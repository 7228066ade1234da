"""CPU linears with oneDNN-packed weights (engine.kernels.cpu_linear) compute exactly what
F.linear computes, leave float32 alone, untie a tied LM head without touching the embedding,
and serve the same tokens as dense weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.engine_setup import build_engine_parts
from engine.kernels import cpu_linear
from engine.loader.load import load_model
from engine.sampling_params import SamplingParams
from tests.engine.conftest import random_drafter_dir
from tests.engine.engine_driver import run

pytestmark = pytest.mark.skipif(
    not cpu_linear.cpu_packing_supported(torch.bfloat16),
    reason="this CPU or torch build cannot pack bf16 weights for oneDNN",
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_is_bit_identical_to_f_linear(dtype, rows, with_bias):
    if not cpu_linear.cpu_packing_supported(dtype):
        pytest.skip(f"{dtype} packing is not supported here")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(dtype)
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


def test_dense_weight_takes_f_linear():
    weight, x = torch.randn(8, 4), torch.randn(3, 4)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))


def test_float32_weights_stay_dense(tiny_model_dir: Path):
    loaded = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu", progress=False)
    assert cpu_linear.pack_module_weights(loaded.model, torch.float32) == 0
    assert not any(p.is_mkldnn for p in loaded.model.parameters())


def test_packing_unties_the_lm_head_and_keeps_logits(tiny_model_dir: Path):
    dense = load_model(str(tiny_model_dir), dtype=torch.bfloat16, device="cpu", progress=False).model
    packed = load_model(str(tiny_model_dir), dtype=torch.bfloat16, device="cpu", progress=False).model
    # 2 layers x (qkv, o, gate_up, down) + the LM head
    assert cpu_linear.pack_module_weights(packed, torch.bfloat16) == 9
    assert cpu_linear.pack_module_weights(packed, torch.bfloat16) == 0  # already packed
    assert packed.lm_head.weight.is_mkldnn
    assert not packed.model.embed_tokens.weight.is_mkldnn  # the embedding keeps its table
    assert torch.equal(packed.model.embed_tokens.weight, dense.model.embed_tokens.weight)
    hidden = torch.randn(7, dense.config.hidden_size).to(torch.bfloat16)
    assert torch.equal(packed.compute_logits(hidden), dense.compute_logits(hidden))


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
    assert any(p.is_mkldnn for p in loaded.model.parameters()) == pack
    if engine.parts.spec is not None:
        assert any(p.is_mkldnn for p in engine.parts.spec.drafter.parameters()) == pack
    return engine


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_packed_engine_serves_the_dense_engines_tokens(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, speculative: bool
):
    drafter = None
    if speculative:
        tiny = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu", progress=False)
        drafter = random_drafter_dir(tmp_path / "drafter", tiny, gamma=4)
    prompts = [[1, 5, 7, 9], [1, 22, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 300]]
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
    dense = run(_engine(tiny_model_dir, False, monkeypatch, drafter), prompts, params)
    packed = run(_engine(tiny_model_dir, True, monkeypatch, drafter), prompts, params)
    assert [f.token_ids for f in packed] == [f.token_ids for f in dense]
    for p, d in zip(packed, dense, strict=True):
        assert [o.new_logprobs for o in p.outputs] == [o.new_logprobs for o in d.outputs]
