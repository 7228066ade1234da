"""What `up`, `gateway` and `worker` share: logging, Ray connection, serving the gateway."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def connect_ray(address: str | None, namespace: str, **init_kwargs: Any) -> None:
    import os

    import ray

    if address is None:  # a new private cluster on this machine: no token to distribute
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    ray.init(
        address=address or "local",
        namespace=namespace,
        include_dashboard=False,
        log_to_driver=True,
        **init_kwargs,
    )


def wait_for_workers(handles: dict[str, Any], timeout_s: float, label: str) -> None:
    """Block until the actors have loaded their model, with a progress bar on stderr."""
    from tqdm import tqdm

    from services.workers.deploy import wait_ready

    start = time.monotonic()
    with tqdm(
        total=len(handles),
        desc=label,
        unit="worker",
        file=sys.stderr,
        bar_format="{desc}: {n}/{total} workers ready [{elapsed}]",
    ) as bar:
        wait_ready(handles, timeout_s, on_ready=lambda name: bar.update(1))
    logging.getLogger("dspark").info("%d workers ready in %.1f s", len(handles), time.monotonic() - start)


def serve_gateway(app: Any, args: argparse.Namespace, ready_line: Callable[[], str | None]) -> int:
    """Run uvicorn until stopped; print `ready_line()` once the gateway can serve. The first
    SIGTERM or SIGINT drains the gateway (docs/design.md §6.9) before uvicorn stops."""
    import uvicorn

    from services.gateway.header_timeout import header_timeout_protocol
    from services.gateway.server import DrainingServer
    from services.heap import freeze_long_lived, thaw

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=args.log_level.lower() == "debug",
        timeout_graceful_shutdown=5,  # after the drain: time for the last events to be written
        http=header_timeout_protocol(args.header_timeout),  # the body's own timeout is the app's
        timeout_keep_alive=5,  # seconds an idle keep-alive connection stays open
    )
    server = DrainingServer(config, app.state.gateway, args.shutdown_grace)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        while not app.state.gateway.pool.ready():
            await asyncio.sleep(0.2)
        freeze_long_lived("gateway")  # what start-up built lives as long as the process
        line = ready_line()
        if line:
            print(line, flush=True)

    async def main() -> None:
        task = asyncio.create_task(announce())
        try:
            await server.serve()
        finally:
            task.cancel()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:  # uvicorn re-raises the stop signal after its graceful shutdown
        pass
    except SystemExit as exc:  # ... which Ray's SIGTERM handler turns into sys.exit(15)
        if exc.code not in (signal.SIGTERM, signal.SIGINT):
            raise
    finally:
        thaw()  # the interpreter's own clean-up at exit frees what start-up built
    return 0


def describe_pool(app: Any) -> str:
    pool = app.state.gateway.pool
    counts: dict[str, int] = {}
    for replica in pool.healthy():
        counts[replica.role] = counts.get(replica.role, 0) + 1
    return ", ".join(f"{role}={n}" for role, n in sorted(counts.items()))
