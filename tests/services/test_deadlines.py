"""Deadlines and keep-alives at the gateway (docs/design.md §6.10): a request past
--request-timeout, or still without its first token at --queue-timeout, gets a 504 (or, once
streaming, an error event and `[DONE]`), and its work leaves the worker; a silent stream sends
SSE comments, which the official client ignores."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai

from services.gateway import GatewayConfig
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

LONG: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story."}],
    "max_tokens": 4000,
    "temperature": 0,
    "ignore_eos": True,
}


def wait_until_idle(loop: EngineLoop, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while loop.engine.requests:
        assert time.monotonic() < deadline, "the request's work was left on the worker"
        time.sleep(0.05)


def test_request_timeout_ends_a_stream_and_refuses_a_whole_response(loop: EngineLoop) -> None:
    with start_gateway(loop, GatewayConfig(request_timeout_s=1.5)) as url:
        wait_ready(url, 60)
        started = time.monotonic()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**LONG, "stream": True}, timeout=60) as r:
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
        took_s = time.monotonic() - started
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "request_timeout" and error["type"] == "timeout"
        assert 1.5 <= took_s < 10
        wait_until_idle(loop)

        whole = httpx.post(f"{url}/v1/chat/completions", json=LONG, timeout=60)
        assert whole.status_code == 504
        assert whole.json()["error"]["code"] == "request_timeout"
        wait_until_idle(loop)


def test_queue_timeout_refuses_a_request_that_waits_for_its_first_token(loop: EngineLoop) -> None:
    # a limit shorter than any prefill: the request cannot have its first token in time
    with start_gateway(loop, GatewayConfig(queue_timeout_s=0.001)) as url:
        wait_ready(url, 60)
        whole = httpx.post(f"{url}/v1/chat/completions", json=LONG, timeout=60)
        assert whole.status_code == 504
        assert whole.json()["error"]["code"] == "queue_timeout"
        wait_until_idle(loop)


def test_silent_streams_send_keepalive_comments_that_clients_ignore(loop: EngineLoop) -> None:
    body = {**LONG, "max_tokens": 8, "stream": True}
    with start_gateway(loop, GatewayConfig(keepalive_s=0.005)) as url:
        wait_ready(url, 60)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            lines = list(r.iter_lines())
        assert ": keep-alive" in lines
        assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=LONG["messages"],
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text
