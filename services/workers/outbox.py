"""Per-consumer buffers of engine outputs, drained by long polls.

The step thread appends a step's events (`put_many`) and wakes waiting pollers; a poller
(`take`, on any asyncio loop) returns at once when something is buffered, otherwise waits
until the next step produces something for it or the timeout passes. One poll therefore
carries every output a consumer got since its previous poll: the number of round trips
follows the step rate, not the number of requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict

from services.waits import within
from services.workers.types import WorkerEvent


class Outbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, list[WorkerEvent]] = defaultdict(list)
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(list)
        self._last_seen_s: dict[str, float] = {}

    def put_many(self, events_by_consumer: dict[str, list[WorkerEvent]]) -> None:
        to_wake: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        with self._lock:
            for consumer, events in events_by_consumer.items():
                if events:
                    self._events[consumer].extend(events)
                    to_wake.extend(self._waiters.pop(consumer, ()))
        _wake(to_wake)

    def touch(self, consumer: str) -> None:
        with self._lock:
            self._last_seen_s[consumer] = time.monotonic()

    def idle_consumers(self, lease_s: float) -> list[str]:
        """Consumers that have not polled (or submitted) for `lease_s` seconds."""
        now = time.monotonic()
        with self._lock:
            return [c for c, t in self._last_seen_s.items() if now - t > lease_s]

    def drop(self, consumer: str) -> None:
        with self._lock:
            self._events.pop(consumer, None)
            self._last_seen_s.pop(consumer, None)
            waiters = self._waiters.pop(consumer, [])
        _wake(waiters)

    def num_consumers(self) -> int:
        with self._lock:
            return len(self._last_seen_s)

    def buffered(self, consumer: str) -> int:
        with self._lock:
            return len(self._events.get(consumer, ()))

    async def take(self, consumer: str, timeout_s: float) -> list[WorkerEvent]:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        while True:
            event = asyncio.Event()
            with self._lock:
                self._last_seen_s[consumer] = time.monotonic()
                events = self._events.pop(consumer, None)
                if events:
                    return events
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._waiters[consumer].append((loop, event))
            try:
                await within(event.wait(), remaining)
            except asyncio.TimeoutError:
                with self._lock:
                    self._last_seen_s[consumer] = time.monotonic()
                    return self._events.pop(consumer, None) or []
            finally:  # woken, timed out or cancelled: nobody waits on this event any more
                with self._lock:
                    waiters = self._waiters.get(consumer, [])
                    if (loop, event) in waiters:
                        waiters.remove((loop, event))


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]) -> None:
    """Set each poller's event on its own loop; a poller whose loop has closed (its gateway
    stopped) is skipped, never an error for the step thread that calls this."""
    for loop, event in waiters:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)
