"""The models on their fused-kernel path against their torch path: a random Llama and Qwen3
(q/k norm, partial rotary) with captured layers, and the DSpark drafter. On CPU the kernels
run interpreted, the dispatch being forced to them (it picks torch for CPU tensors)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_cases import DEVICE
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from engine.kernels import activation, norm, rope
from engine.loader.load import build_model, load_weights, open_checkpoint
from engine.models.context import ForwardContext
from tests.models.model_harness import default_backend, make_cache, make_metadata
from tests.models.random_models import save_random_hf_model
from tests.speculative.spec_helpers import make_drafter, make_scenario, tiny_config

CAPTURE_LAYERS = (2, 0)
GEMMS = {"aten::linear", "aten::mm", "aten::addmm", "aten::matmul"}  # how F.linear reaches the mode


def set_fused_path(monkeypatch: pytest.MonkeyPatch, fused: bool) -> None:
    for module in (activation, norm, rope):
        monkeypatch.setattr(module, "use_triton", lambda *tensors: fused)


@pytest.fixture(scope="module", params=["llama", "qwen3-partial-rotary"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[torch.nn.Module]:
    directory: Path = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        save_random_hf_model(directory, "llama")
    else:
        save_random_hf_model(directory, "qwen3", partial_rotary_factor=0.5)
    checkpoint = open_checkpoint(str(directory))
    built = build_model(checkpoint.config, dtype="float32", device=DEVICE)
    load_weights(built, checkpoint, progress=False)
    yield built


def run(model: torch.nn.Module, tokens: list[int]) -> list[torch.Tensor]:
    """Prefill all but the last two tokens, then decode them one by one: per forward, the
    logits and the captured residual streams."""
    cache = make_cache(model, 1, 16)
    steps = [(0, len(tokens) - 2), (len(tokens) - 2, 1), (len(tokens) - 1, 1)]
    outputs = []
    with torch.inference_mode():
        for prefix, extend in steps:
            meta, positions = make_metadata(cache, [0], [prefix], [extend])
            ctx = ForwardContext(meta=meta, kv=cache, backend=default_backend(), capture_layers=CAPTURE_LAYERS)
            ids = torch.tensor(tokens[prefix : prefix + extend], device=DEVICE)
            hidden = model(ids, positions, ctx)
            outputs += [model.compute_logits(hidden), *ctx.captured]
    return outputs


def test_model_fused_path_matches_torch_path(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = torch.randint(0, 384, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    set_fused_path(monkeypatch, False)
    reference = run(model, tokens)
    set_fused_path(monkeypatch, True)
    fused = run(model, tokens)
    for got, expected in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


class KernelCounter(TorchDispatchMode):
    """Counts what a forward launches: aten ops that write memory (new storage, or in place;
    views and allocations launch nothing), Triton kernels and attention calls by name (their
    insides are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: collections.Counter[str] = collections.Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if self.paused or func._schema.name.startswith("aten::empty"):
            return out
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if func._schema.name.endswith("_") or any(t.untyped_storage().data_ptr() not in inputs for t in outputs):
            name = func._schema.name
            self.launches["gemm" if name in GEMMS else name] += 1
        return out

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.launches[name] += 1
            self.paused = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused = False

        return counted


def test_decoder_layer_launches_on_the_fused_path(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per layer: 4 GEMMs, attention, and 4 Triton kernels (add+norm, RoPE, add+norm,
    silu-and-mul), plus Qwen3's two q/k norms; nothing else. The torch path launched ~43 plus
    attention (bf16, decode)."""
    set_fused_path(monkeypatch, True)
    counter = KernelCounter()
    for module, name in (
        (norm, "rms_norm_triton"),
        (norm, "add_rms_norm_triton"),
        (rope, "rotary_embedding_triton"),
        (activation, "silu_and_mul_triton"),
    ):
        monkeypatch.setattr(module, name, counter.wrap(name, getattr(module, name)))
    backend = default_backend()
    monkeypatch.setattr(backend, "forward", counter.wrap("attention", backend.forward))
    cache = make_cache(model, 1, 16)
    meta, positions = make_metadata(cache, [0], [3], [1])
    ids, num_layers = torch.tensor([5], device=DEVICE), len(model.model.layers)
    with torch.inference_mode(), counter:
        model(ids, positions, ForwardContext(meta=meta, kv=cache, backend=backend))
    qk_norm = model.config.qk_norm
    assert counter.launches == {
        "aten::embedding": 1,
        "gemm": 4 * num_layers,
        "attention": num_layers,
        "rms_norm_triton": 1 + (2 * num_layers if qk_norm else 0),  # layer 0 has no residual to add
        "add_rms_norm_triton": 2 * num_layers,  # the last one is the final norm
        "rotary_embedding_triton": num_layers,
        "silu_and_mul_triton": num_layers,
    }


@pytest.mark.parametrize("overrides", [{}, {"num_layers": 1, "rope_dim": 4, "num_kv_heads": 1}])
def test_drafter_fused_path_matches_torch_path(overrides: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(**overrides)
    drafter, target = make_drafter(config, seed=3)
    drafter.to(DEVICE)
    target.embedding = target.embedding.to(DEVICE)  # the shared embedding and LM head
    anchor = torch.tensor([7, 0, 45], device=DEVICE)
    zeros, keys = torch.zeros(3, device=DEVICE), torch.arange(3, device=DEVICE)
    proposals = []
    for fused in (False, True):
        set_fused_path(monkeypatch, fused)
        scenario = make_scenario(config, [5, 9, 1], seed=4)
        scenario.pool.k, scenario.pool.v = scenario.pool.k.to(DEVICE), scenario.pool.v.to(DEVICE)
        scenario.req_to_token, scenario.rows = scenario.req_to_token.to(DEVICE), scenario.rows.to(DEVICE)
        scenario.seq_lens = scenario.seq_lens.to(DEVICE)
        aux, positions, slots = (t.to(DEVICE) for t in scenario.flat_context())
        ctx, block_positions = scenario.block_context(config.gamma)
        with torch.no_grad():
            drafter.inject_kv(aux, positions, slots, scenario.pool)
            proposals.append(drafter.propose(anchor, ctx, block_positions.to(DEVICE), zeros, keys, keys))
    reference, got = proposals
    assert torch.equal(got.draft_tokens, reference.draft_tokens)
    torch.testing.assert_close(got.draft_logits, reference.draft_logits, rtol=1e-4, atol=1e-4)
