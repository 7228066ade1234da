"""A serving stack on the session's local Ray cluster: named worker actors, the gateway app
on a loopback port, and helpers to drive it with the official openai client."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import ray

from engine.config import EngineConfig
from services.gateway import GatewayConfig, create_app
from services.gateway.pool import PoolConfig, RayDiscovery
from services.workers.deploy import WorkerOptions, spawn_workers, wait_ready
from services.workers.types import Role
from tests.services.cli_process import greedy_stream_body
from tests.services.conftest import MODEL, chat_token_ids, greedy_reference, test_engine_config
from tests.services.serving import serve
from tests.services.serving import wait_ready as wait_http_ready

FAST_POOL = PoolConfig(stats_interval_s=0.25, health_timeout_s=3.0, discovery_interval_s=1.0)

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "What is 12 times 12?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
    "Give me a synonym for happy.",
    "What is the largest planet?",
    "Translate 'hello' into Spanish.",
    "What does CPU stand for?",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "Name a famous physicist.",
    "What is the square root of 81?",
    "Which ocean is the largest?",
    "What language is spoken in Brazil?",
    "What is H2O?",
    "How many days are in a leap year?",
    "What is the opposite of cold?",
    "Name a fruit that is yellow.",
    "What is the chemical symbol for gold?",
]


def spawn(topology: Sequence[tuple[Role, int]], deployment: str, engine_config: EngineConfig) -> dict[str, Any]:
    """Create the worker actors; they load the model in the background."""
    handles: dict[str, Any] = {}
    options = WorkerOptions(num_cpus=1, max_restarts=-1)
    for role, replicas in topology:
        handles.update(spawn_workers(role, replicas, engine_config, options, deployment=deployment))
    return handles


@dataclass
class Stack:
    url: str
    app: Any
    handles: dict[str, Any]

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def handle(self, role: Role) -> Any:
        return next(h for name, h in self.handles.items() if f"-{role}-" in name)

    def worker_stats(self) -> dict[str, Any]:
        return {name: ray.get(h.stats.remote(), timeout=60).engine for name, h in self.handles.items()}

    def wait_workers_idle(self, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.worker_stats()
            if all(s.kv_used_slots == 0 and s.num_running == 0 and s.num_waiting == 0 for s in stats.values()):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"workers not idle after {timeout_s} s: {stats}")
            time.sleep(0.1)


@contextlib.contextmanager
def gateway(handles: dict[str, Any], deployment: str, config: GatewayConfig | None = None) -> Iterator[Stack]:
    wait_ready(handles, 900)
    app = create_app(RayDiscovery(deployment), config or GatewayConfig(pool=FAST_POOL))
    with serve(app) as url:
        wait_http_ready(url, 120)
        yield Stack(url, app, handles)


def kill_all(handles: dict[str, Any]) -> None:
    for handle in handles.values():
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


@contextlib.contextmanager
def workers(topology: Sequence[tuple[Role, int]], deployment: str) -> Iterator[dict[str, Any]]:
    """The worker actors of `topology` with the default engine, killed on the way out."""
    handles = spawn(topology, deployment, test_engine_config())
    try:
        yield handles
    finally:
        kill_all(handles)


def offline_answers(engine_core: Any, max_tokens: int) -> list[str]:
    """The offline engine's greedy answers to QUESTIONS, which every served stream must match."""
    return greedy_reference(engine_core, [chat_token_ids(engine_core, q) for q in QUESTIONS], max_tokens)


def stream_text(client: openai.OpenAI, question: str, max_tokens: int, **extra: Any) -> str:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        **extra,
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def concurrent_streams(client: openai.OpenAI, questions: Sequence[str], max_tokens: int) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
        return list(pool.map(lambda q: stream_text(client, q, max_tokens), questions))


def disconnect_after(url: str, question: str, chunks: int) -> None:
    """Stream a long answer, read `chunks` content chunks, then hang up."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 1000,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        seen = 0
        for line in response.iter_lines():
            seen += '"content":"' in line and '"content":""' not in line
            if seen >= chunks:
                return
    raise AssertionError("the stream ended before the client hung up")


def disconnects_and_streams(stack: Stack, questions: Sequence[str], max_tokens: int, num_disconnects: int) -> list[str]:
    """`num_disconnects` clients hang up mid-stream while the others stream to the end."""
    with concurrent.futures.ThreadPoolExecutor(len(questions) + num_disconnects) as pool:
        quitters = [
            pool.submit(disconnect_after, stack.url, f"Tell a long story number {i}.", 3)
            for i in range(num_disconnects)
        ]
        finishers = [pool.submit(stream_text, stack.client, q, max_tokens) for q in questions]
        for quitter in quitters:
            quitter.result()
        return [f.result() for f in finishers]


def stream_story(url: str, question: str, max_tokens: int, progress: list[int], i: int) -> str:
    """A greedy streaming chat answer of exactly `max_tokens` tokens (ignore_eos), read as raw SSE;
    `progress[i]` follows the characters received. No event may be an error."""
    body = greedy_stream_body(question, max_tokens)
    text = ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line.removeprefix("data: "))
            assert "error" not in payload, payload
            for choice in payload["choices"]:
                text += choice["delta"].get("content") or ""
                progress[i] = len(text)
    return text
