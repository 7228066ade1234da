"""Clients that leave early or send slowly, against the in-process gateway over the real
engine (docs/design.md §6.8): a client that leaves while its body is tokenised or its
choices are submitted leaves nothing running (tokenising stops, the worker's KV returns to
0), one that leaves mid-upload is a 499 (never a 500), and slow headers and bodies are cut
off by their timeouts."""

from __future__ import annotations

import json
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from engine.handoff import Continuation
from engine.sampling_params import SamplingParams
from services.gateway import GatewayConfig, create_app
from services.gateway.config import AdmissionConfig
from services.gateway.header_timeout import header_timeout_protocol
from services.gateway.pool import StaticDiscovery
from services.workers.client import LocalWorkerClient
from services.workers.engine_loop import EngineLoop
from services.workers.types import Ack
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import serve, wait_ready

pytestmark = pytest.mark.timeout(600)

TEXT = "The quick brown fox jumps over the lazy dog; Köln, 日本, 🙂.\n"  # 22 tokens


class CountingTokenizer:
    """The model's tokenizer, counting the texts it encodes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.encoded = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded += 1
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


class CountingClient(LocalWorkerClient):
    """The in-process worker, counting the requests it is asked to add, with a counting tokenizer."""

    def __init__(self, replica_id: str, loop: EngineLoop) -> None:
        super().__init__(replica_id, loop)
        self.added = 0
        self.tokenizer = CountingTokenizer(loop.engine.tokenizer)

    async def get_tokenizer(self, timeout_s: float) -> Any:
        return self.tokenizer

    async def add_request(
        self,
        consumer: str,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prefill_only: bool,
        timeout_s: float,
        continuation: Continuation | None = None,
    ) -> Ack:
        self.added += 1
        return await super().add_request(
            consumer, request_id, prompt_token_ids, params, prefill_only, timeout_s, continuation
        )


@contextmanager
def counting_gateway(loop: EngineLoop, config: GatewayConfig) -> Iterator[tuple[str, CountingClient]]:
    client = CountingClient("local-0", loop)
    with serve(create_app(StaticDiscovery([client]), config)) as url:
        wait_ready(url, 60)
        yield url, client


def wait_for_empty_worker(loop: EngineLoop, timeout_s: float) -> float:
    """Seconds until the engine holds no request and no KV."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        stats = loop.stats().engine
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_used_slots == 0:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"the worker still holds requests after {timeout_s} s: {loop.stats().engine}")


def requests_counted(url: str, status: int, model: str = MODEL) -> float:
    line = f'dspark_requests_total{{model="{model}",role="gateway",status="{status}"}} '
    for row in httpx.get(f"{url}/metrics").text.splitlines():
        if row.startswith(line):
            return float(row[len(line) :])
    return 0.0


def raw_request(url: str, head: bytes, body_part: bytes = b"") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head + body_part)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def post_head(path: str, content_length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {content_length}\r\n\r\n"
    ).encode()


def leave_when(url: str, path: str, body: dict[str, Any], ready: Callable[[], bool]) -> None:
    """Send the whole request, and hang up as soon as `ready()`, before any response."""
    content = json.dumps(body, ensure_ascii=False).encode()
    sock = raw_request(url, post_head(path, len(content)), content)
    deadline = time.monotonic() + 60
    while not ready():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    sock.close()


def test_leaving_while_choices_are_submitted_leaves_nothing_on_the_worker(loop: EngineLoop) -> None:
    with counting_gateway(loop, GatewayConfig()) as (url, client):
        rng = random.Random(time.monotonic_ns())
        prompts = [[rng.randrange(100, 40_000) for _ in range(8)] for _ in range(128)]
        body = {"model": MODEL, "prompt": prompts, "max_tokens": 500, "ignore_eos": True}
        leave_when(url, "/v1/completions", body, lambda: client.added >= 10)
        assert wait_for_empty_worker(loop, 15) < 5.0
        added = client.added
        time.sleep(0.5)
        assert client.added == added < len(prompts)  # submitting stopped when the client left
        assert requests_counted(url, 499) == 1 and requests_counted(url, 500) == 0


def test_leaving_while_prompts_are_tokenised_stops_tokenising(loop: EngineLoop) -> None:
    # one preparation thread: the request sent next waits for whatever it still does
    admission = AdmissionConfig(tokenizer_threads=1, max_tokens_per_request=10**8)
    with counting_gateway(loop, GatewayConfig(admission=admission)) as (url, client):
        prompts = [f"{i}: " + TEXT * 350 for i in range(128)]  # 7,700 tokens each
        leave_when(
            url,
            "/v1/completions",
            {"model": MODEL, "prompt": prompts, "max_tokens": 1},
            lambda: client.tokenizer.encoded >= 10,
        )
        encoded = client.tokenizer.encoded
        small = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1}, timeout=60)
        assert small.status_code == 200
        # at most the prompt being tokenised when the client left, then the small request's
        assert client.tokenizer.encoded <= encoded + 2 < len(prompts)
        assert client.added == 1  # only the small request reached the worker
        assert requests_counted(url, 499) == 1


def test_leaving_mid_upload_is_a_499_not_a_500(url: str, caplog: pytest.LogCaptureFixture) -> None:
    before_499, before_500 = requests_counted(url, 499, "unknown"), requests_counted(url, 500, "unknown")
    with caplog.at_level(logging.INFO, logger="services.gateway"):
        sock = raw_request(url, post_head("/v1/chat/completions", 100_000), b'{"model": "' + b"x" * 1000)
        time.sleep(0.3)
        sock.close()
        deadline = time.monotonic() + 10
        while requests_counted(url, 499, "unknown") == before_499 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert requests_counted(url, 499, "unknown") == before_499 + 1
    assert requests_counted(url, 500, "unknown") == before_500
    assert any("-> 499" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records), caplog.text
    assert not any(r.levelno >= logging.ERROR for r in caplog.records), caplog.text


def test_a_body_slower_than_its_timeout_gets_a_408(loop: EngineLoop) -> None:
    with start_gateway(loop, GatewayConfig(admission=AdmissionConfig(body_timeout_s=0.5))) as url:
        wait_ready(url, 60)
        sock = raw_request(url, post_head("/v1/completions", 1000), b'{"model": ')
        start = time.monotonic()
        reply = read_all(sock)  # the server answers and closes the connection
        assert 0.3 < time.monotonic() - start < 5.0
        assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in reply, reply
        assert requests_counted(url, 408, "unknown") == 1


def test_headers_slower_than_their_timeout_close_the_connection() -> None:
    app = create_app(StaticDiscovery([]))
    with serve(app, http=header_timeout_protocol(0.5)) as url:
        silent = raw_request(url, b"")
        partial = raw_request(url, b"POST /tokenize HTTP/1.1\r\nHost: test\r\n")
        start = time.monotonic()
        for sock in (silent, partial):
            assert read_all(sock).startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - start < 5.0
        # the timer covers the headers only: a body sent later is still read and answered
        whole = raw_request(url, post_head("/tokenize", 17))
        time.sleep(1.0)
        whole.sendall(b'{"prompt": "hi"} ')
        answer = whole.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 "), answer  # no worker yet: a real answer
        whole.close()
