"""A worker drained under load hands its requests back at the end of its grace, and the gateway
moves them to the other worker (docs/design.md §5.6, §6.9): every stream completes with the
text of an undisturbed run, and the drained worker is left empty."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from services.gateway import GatewayConfig, create_app
from services.gateway.pool import PoolConfig, StaticDiscovery
from services.workers.client import LocalWorkerClient
from services.workers.drain import drain_within
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import chat_token_ids, colocated_loop, greedy_reference, test_engine_config
from tests.services.serving import serve, wait_ready
from tests.services.stack import stream_story

STORIES = [f"Tell a long story number {i}." for i in range(6)]
STORY_TOKENS = 64


@pytest.fixture(scope="module")
def second_engine() -> EngineCore:
    return EngineCore(test_engine_config())


@pytest.fixture(scope="module")
def stories(second_engine: EngineCore) -> list[str]:
    prompts = [chat_token_ids(second_engine, q) for q in STORIES]
    return greedy_reference(second_engine, prompts, STORY_TOKENS, ignore_eos=True)


@pytest.fixture(params=[None, len(STORIES) // 2], ids=["room", "full"])
def two_workers(
    request: pytest.FixtureRequest, loop: EngineLoop, second_engine: EngineCore, stories: list[str]
) -> Iterator[tuple[str, EngineLoop]]:
    """`full`: each worker takes half the stories at most, so the streams fill both workers and the
    drained worker's move onto one already at capacity (an admitted stream is never refused)."""
    other = colocated_loop(second_engine, "local-1")
    clients = [LocalWorkerClient("local-0", loop), LocalWorkerClient("local-1", other)]
    config = GatewayConfig(pool=PoolConfig(stats_interval_s=0.1, max_inflight_per_worker=request.param))
    try:
        with serve(create_app(StaticDiscovery(clients), config)) as url:
            wait_ready(url, 60, healthy_workers=2)
            yield url, other
    finally:
        other.shutdown()


def test_a_drained_worker_hands_its_streams_to_the_other(
    two_workers: tuple[str, EngineLoop], loop: EngineLoop, stories: list[str]
) -> None:
    url, other = two_workers
    progress = [0] * len(STORIES)
    with concurrent.futures.ThreadPoolExecutor(len(STORIES)) as pool:
        futures = [pool.submit(stream_story, url, q, STORY_TOKENS, progress, i) for i, q in enumerate(STORIES)]
        deadline = time.monotonic() + 120
        while min(progress) < 8:
            assert time.monotonic() < deadline, progress
            time.sleep(0.02)
        # the fixture's own worker is drained: `loop` serves other tests after this one
        held_there = len(other.engine.requests)
        assert held_there > 0, "the router gave the second worker nothing to drain"
        other.drain()
        threading.Event().wait(0.2)  # a short grace, over before the streams can finish
        other.evict()
        texts = [f.result(timeout=300) for f in futures]
    assert texts == stories
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    drained = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("dspark_request_migrations_total{") and 'reason="drain"' in line
    )
    assert drained >= 1
    deadline = time.monotonic() + 30
    while loop.engine.requests or other.engine.requests:
        assert time.monotonic() < deadline, "requests left on a worker"
        time.sleep(0.05)


def test_a_drain_returns_once_its_worker_has_handed_everything_back(second_engine: EngineCore) -> None:
    """What `dspark-serve drain` waits for before the pod's `ray stop`: when the drain returns,
    the worker holds nothing and the hand-back is in its gateway's outbox."""
    worker = colocated_loop(second_engine, "local-2")
    try:
        params = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)
        prompt = chat_token_ids(second_engine, "Tell a long story.")
        assert worker.add_request("gw", "held-0", prompt, params).result(timeout=60).ok
        deadline = time.monotonic() + 60
        while worker.stats().engine.num_running == 0:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.02)

        asyncio.run(drain_within(worker, grace_s=0.0))
        assert worker.stats().num_held == 0  # at once: the drain returned after the hand-back
        events = asyncio.run(worker.poll("gw", timeout_s=5.0)).events
        assert events[-1].output.request_id == "held-0" and events[-1].output.finish_reason == "migrate"
    finally:
        worker.shutdown()
