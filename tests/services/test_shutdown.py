"""Stopping the gateway (docs/design.md §6.9): the first SIGTERM makes it not ready and refuse new
requests, running streams get the grace to finish, and whatever is still running after it ends
with an error event and `[DONE]`, never a cut body; nothing is left on the worker."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from services.gateway import GatewayConfig, create_app
from services.gateway.pool import StaticDiscovery
from services.gateway.server import DrainingServer
from services.workers.client import LocalWorkerClient
from services.workers.engine_loop import EngineLoop
from tests.services.cli_process import stream_events
from tests.services.conftest import MODEL
from tests.services.serving import free_port, wait_ready

GRACE_S = 3.0


class Running:
    def __init__(self, server: DrainingServer, thread: threading.Thread, url: str) -> None:
        self.server, self.thread, self.url = server, thread, url


@pytest.fixture
def running(loop: EngineLoop) -> Iterator[Running]:
    app = create_app(StaticDiscovery([LocalWorkerClient("local-0", loop)]), GatewayConfig())
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)
    server = DrainingServer(config, app.state.gateway, GRACE_S)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, 60)
    yield Running(server, thread, url)
    server.should_exit = True
    thread.join(30)


def test_sigterm_under_ten_streams_ends_every_stream_with_done(running: Running, loop: EngineLoop) -> None:
    lengths = [4] * 5 + [4000] * 5  # five finish within the grace, five cannot
    started = [threading.Event() for _ in lengths]
    with concurrent.futures.ThreadPoolExecutor(len(lengths)) as pool:
        futures = [pool.submit(stream_events, running.url, n, event) for n, event in zip(lengths, started, strict=True)]
        for event in started:
            assert event.wait(120)
        signalled_at = time.monotonic()
        running.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls

        ready = httpx.get(f"{running.url}/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = httpx.post(
            f"{running.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=10,
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["type"]

        results = [f.result(timeout=60) for f in futures]
    ended_after_s = time.monotonic() - signalled_at

    for n, events in zip(lengths, results, strict=True):
        assert events[-1] == "[DONE]", events[-3:]
        payloads: list[dict[str, Any]] = [json.loads(e) for e in events[:-1]]
        if n == 4:
            assert not any("error" in p for p in payloads)
            assert payloads[-1]["choices"][0]["finish_reason"] == "length"
        else:
            error = payloads[-1]["error"]
            assert "shutting down" in error["message"] and "worker" not in error["message"], error
            assert error["code"] == "shutting_down"
    assert GRACE_S <= ended_after_s < GRACE_S + 10
    running.thread.join(30)
    assert not running.thread.is_alive()
    deadline = time.monotonic() + 30
    while loop.engine.requests:
        assert time.monotonic() < deadline, "requests left on the worker"
        time.sleep(0.05)
