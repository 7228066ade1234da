"""Per-worker caps shared by gateways (docs/design.md §6.8): two in-process gateways over one
real engine; with --shared-admission a gateway counts the requests the other holds on the
worker (from the worker's stats) against the cap, without it only its own."""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import pytest
from fastapi import FastAPI

from services.gateway import GatewayConfig, create_app
from services.gateway.pool import PoolConfig, StaticDiscovery
from services.workers.client import LocalWorkerClient
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL
from tests.services.serving import serve, wait_ready

pytestmark = pytest.mark.timeout(600)

SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = {**SHORT, "max_tokens": 2000, "ignore_eos": True, "stream": True}


def gateway(stack: ExitStack, loop: EngineLoop, shared: bool) -> tuple[str, FastAPI]:
    pool = PoolConfig(max_inflight_per_worker=2, shared_admission=shared, stats_interval_s=0.1)
    app = create_app(StaticDiscovery([LocalWorkerClient("local-0", loop)]), GatewayConfig(pool=pool))
    url = stack.enter_context(serve(app))
    wait_ready(url, 60)
    return url, app


def hold_streams(stack: ExitStack, url: str, count: int) -> None:
    """Open `count` long streams, held open until the stack closes."""
    for _ in range(count):
        stream = stack.enter_context(httpx.stream("POST", f"{url}/v1/chat/completions", json=LONG, timeout=60))
        lines = stream.iter_lines()
        assert next(lines).startswith("data:")
        stack.callback(lines.close)


def test_a_shared_cap_counts_the_other_gateways_requests(loop: EngineLoop) -> None:
    with ExitStack() as stack:
        holder_url, _ = gateway(stack, loop, shared=False)
        shared_url, shared_app = gateway(stack, loop, shared=True)
        own_url, _ = gateway(stack, loop, shared=False)
        hold_streams(stack, holder_url, 2)  # the worker now runs two requests of the first gateway
        replica = shared_app.state.gateway.pool.replicas["local-0"]
        deadline = time.monotonic() + 10
        while replica.stats.engine.num_running < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = httpx.post(f"{shared_url}/v1/chat/completions", json=SHORT, timeout=60)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "server_overloaded"
        # a gateway counting only its own requests admits it, and the worker queues a third
        assert httpx.post(f"{own_url}/v1/chat/completions", json=SHORT, timeout=60).status_code == 200
        assert httpx.post(f"{holder_url}/v1/chat/completions", json=SHORT, timeout=60).status_code == 429
