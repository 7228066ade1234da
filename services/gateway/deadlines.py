"""A request's deadlines at the gateway, and the wait for its next output under them
(docs/design.md §6.10)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.outputs import RequestOutput
from services.gateway.errors import RequestTimedOut
from services.gateway.tracked import Sink
from services.waits import within


@dataclass(frozen=True)
class Deadlines:
    """Seconds on the gateway's perf_counter clock; None: no such deadline."""

    arrival_s: float
    request_timeout_s: float | None  # the whole request, first byte to last
    queue_timeout_s: float | None  # until the first token
    keepalive_s: float  # a stream with nothing to send says so this often

    def check(self, now: float, has_token: bool) -> None:
        """Raise the OpenAI-shaped error of a deadline that has passed."""
        waited = now - self.arrival_s
        if self.request_timeout_s is not None and waited >= self.request_timeout_s:
            raise RequestTimedOut(
                f"The request took longer than the server's limit of {self.request_timeout_s:g} s.",
                "request_timeout",
            )
        if not has_token and self.queue_timeout_s is not None and waited >= self.queue_timeout_s:
            raise RequestTimedOut(
                f"The request waited {self.queue_timeout_s:g} s without being served; retry later.",
                "queue_timeout",
            )

    def wait_s(self, now: float, has_token: bool) -> float:
        """How long the next wait may last before a keep-alive or a deadline is due."""
        waits = [self.keepalive_s]
        if self.request_timeout_s is not None:
            waits.append(self.arrival_s + self.request_timeout_s - now)
        if not has_token and self.queue_timeout_s is not None:
            waits.append(self.arrival_s + self.queue_timeout_s - now)
        return max(0.0, min(waits))


async def next_output(sink: Sink, deadlines: Deadlines, has_token: bool) -> tuple[int, RequestOutput] | None:
    """The next `(choice index, output)`; None when `keepalive_s` passed without one (a stream
    then sends a comment, so that proxies with idle timeouts keep the connection). Raises
    `RequestTimedOut` once a deadline has passed; the caller aborts the request's choices."""
    deadlines.check(time.perf_counter(), has_token)
    try:
        return await within(sink.get(), deadlines.wait_s(time.perf_counter(), has_token))
    except TimeoutError:
        deadlines.check(time.perf_counter(), has_token)
        return None
