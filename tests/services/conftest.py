"""Shared fixtures of the services tests: the real engine on the embedded model, and one
local Ray cluster for the session (each e2e module starts its own workers on it)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams

MODEL = "smollm2-135m"
KV_BYTES = 512 * 1024 * 1024  # ~11k token slots: one full-context request, small on shared machines


def test_engine_config() -> EngineConfig:
    """What `dspark-serve up` runs by default (speculative when the model ships a drafter)."""
    from engine.config import SpeculativeConfig
    from services.cli.options import shipped_drafter_available

    speculative = SpeculativeConfig() if shipped_drafter_available(MODEL) else None
    return EngineConfig(model=MODEL, max_num_seqs=32, kv_cache_memory_bytes=KV_BYTES, speculative=speculative)


test_engine_config.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def engine_core() -> Any:
    """One in-process EngineCore for the session: the offline reference, and the engine of
    the in-process gateway tests (never both at once)."""
    from engine.core import EngineCore

    return EngineCore(test_engine_config())


def drain(engine: Any) -> None:
    """Abort whatever a test left in the engine and run it idle."""
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()


def greedy_reference(engine: Any, prompts: Sequence[list[int]], max_tokens: int) -> list[str]:
    """Offline greedy outputs of the engine for the prompts, all in one batch."""
    drain(engine)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"ref-{i}", list(prompt), params)
    texts = {f"ref-{i}": "" for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] += out.new_text
    return [texts[f"ref-{i}"] for i in range(len(prompts))]


def chat_token_ids(engine: Any, content: str) -> list[int]:
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",  # a private cluster, never one that happens to run on this machine
        num_cpus=8,
        include_dashboard=False,
        namespace="dspark-tests",
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
