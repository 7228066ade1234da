"""The gateway's HTTP server: uvicorn, with a drain between the stop signal and the exit
(docs/design.md §6.9)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from services.gateway.errors import ServiceUnavailable

if TYPE_CHECKING:
    from services.gateway.app import Gateway

logger = logging.getLogger(__name__)


async def drain(gateway: Gateway, grace_s: float) -> None:
    """Stop admitting (`/ready` says draining, generation routes answer 503), give running
    requests `grace_s` seconds to finish, then end the rest with an error event and `[DONE]`."""
    gateway.draining = True
    dispatcher = gateway.dispatcher
    deadline = time.monotonic() + grace_s
    while dispatcher.requests and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left = list(dispatcher.requests.values())
    if left:
        logger.warning("shutting down: ending %d requests still running after %.0f s", len(left), grace_s)
    message = f"The server is shutting down: the request did not finish within the {grace_s:.0f} s grace"
    for tracked in left:
        dispatcher.fail(tracked, message, failure=ServiceUnavailable(message, code="shutting_down"))


class DrainingServer(uvicorn.Server):
    """The first SIGTERM or SIGINT drains the gateway (`drain`), and only then stops uvicorn;
    a second signal stops it at once."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway, grace_s: float) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: concurrent.futures.Future[None] | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None or self._loop is None or not self.started:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # uvicorn raises it again once stopped
        self._drain = asyncio.run_coroutine_threadsafe(self._drain_then_stop(), self._loop)

    async def _drain_then_stop(self) -> None:
        try:
            await drain(self.gateway, self.grace_s)
        finally:
            self.should_exit = True
