"""Test helpers: the `dspark-serve` command as a real process (and a Ray head of the test's own),
its log, its Ray processes, and streaming chat requests read as raw SSE events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.services.conftest import MODEL

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def dspark_serve(*args: str, log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """`python -m services.cli ARGS` with stdout and stderr in `log`; SIGINT (then SIGKILL) on the way out."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(90)
                except subprocess.TimeoutExpired:
                    process.kill()


@contextmanager
def ray_head(port: int, log: Path, num_cpus: int = 4) -> Iterator[str]:
    """A Ray cluster of the test's own (`ray start --head --block`), stopped through its own process
    (never `ray stop`: other clusters run on this machine). Yields its address."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                "ray",
                "start",
                "--head",
                "--block",
                f"--port={port}",
                f"--num-cpus={num_cpus}",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield f"127.0.0.1:{port}"
        finally:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(60)
            except subprocess.TimeoutExpired:
                head.kill()


def wait_for_line(log: Path, prefix: str, process: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith(prefix):
                return line
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"no line starting with {prefix!r}; log tail:\n{log.read_text()[-3000:]}")


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below `pid` now: for `up`, the Ray cluster it started (GCS, raylet, workers)."""
    return psutil.Process(pid).children(recursive=True)


def still_alive(processes: list[psutil.Process], timeout_s: float) -> list[str]:
    """Those of `processes` alive after `timeout_s` seconds, as "pid name" (zombies count as gone)."""
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    left = []
    for process in alive:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {process.name()}")
        except psutil.NoSuchProcess:
            pass
    return left


def greedy_stream_body(question: str, max_tokens: int) -> dict[str, Any]:
    """A greedy streaming chat request of exactly `max_tokens` tokens (ignore_eos)."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }


def stream_events(
    url: str, max_tokens: int, started: threading.Event, question: str = "Tell a long story."
) -> list[str]:
    """A greedy streaming chat request, read to the end of the body: the `data:` payloads in order
    (the last is "[DONE]" unless the body was cut). `started` is set at the first generated text
    (not at the role chunk, whose content is empty: the request may still wait for its prefill)."""
    body = greedy_stream_body(question, max_tokens)
    events: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                if '"content":"' in line and '"content":""' not in line:
                    started.set()
    return events
