"""Test helpers: run an ASGI app on a real loopback port (uvicorn in a thread)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(app: object, timeout_s: float = 60.0, **options: Any) -> Iterator[str]:
    """Serve `app` on 127.0.0.1:<free port> (`options`: more uvicorn.Config arguments); yields the base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **options)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def wait_ready(base_url: str, timeout_s: float = 300.0, healthy_workers: int = 1) -> None:
    """Until /ready answers 200 with at least `healthy_workers` workers healthy."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"{base_url}/ready", timeout=5)
            if last.status_code == 200 and sum(w["healthy"] for w in last.json()["workers"]) >= healthy_workers:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{base_url} not ready after {timeout_s} s: {getattr(last, 'text', last)}")
