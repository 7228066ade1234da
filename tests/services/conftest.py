"""Shared fixtures of the services tests: the real engine on the embedded model, the gateway
app over it in-process (no Ray), and one local Ray cluster for the session (each e2e module
starts its own workers on it)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pytest

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from tests.services.serving import serve, wait_ready

if TYPE_CHECKING:
    from services.gateway import GatewayConfig
    from services.workers.engine_loop import EngineLoop

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


def greedy_reference(
    engine: Any, prompts: Sequence[list[int]], max_tokens: int, *, ignore_eos: bool = False
) -> list[str]:
    """Offline greedy outputs of the engine for the prompts, all in one batch."""
    drain(engine)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
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


def colocated_loop(engine: Any, replica_id: str) -> EngineLoop:
    """`engine` driven by a started EngineLoop thread, as a colocated worker drives it."""
    from services.workers.engine_loop import EngineLoop
    from services.workers.transfer import InProcessTransfer

    return EngineLoop(
        engine,
        role="worker",
        replica_id=replica_id,
        transfer=InProcessTransfer(),
        max_num_seqs=engine.config.max_num_seqs,
        speculative=False,
    ).start()


@pytest.fixture(scope="module")
def loop(engine_core: Any) -> Iterator[EngineLoop]:
    """The session engine driven by an EngineLoop thread, as a colocated worker drives it."""

    drain(engine_core)
    engine_loop = colocated_loop(engine_core, "local-0")
    yield engine_loop
    engine_loop.shutdown()
    drain(engine_core)


def start_gateway(loop: EngineLoop, config: GatewayConfig | None = None) -> AbstractContextManager[str]:
    """The gateway app over `loop` as its one worker, served on a loopback port (the base URL)."""
    from services.gateway import GatewayConfig, create_app
    from services.gateway.pool import StaticDiscovery
    from services.workers.client import LocalWorkerClient

    return serve(create_app(StaticDiscovery([LocalWorkerClient("local-0", loop)]), config or GatewayConfig()))


@pytest.fixture(scope="module")
def url(loop: EngineLoop) -> Iterator[str]:
    """Base URL of a ready gateway with the default config over `loop`."""
    with start_gateway(loop) as base:
        wait_ready(base, 60)
        yield base


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
