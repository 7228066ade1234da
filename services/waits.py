"""Bounded waits that a cancellation always stops.

Not `asyncio.wait_for`: on Python 3.11 it returns the awaited result instead of raising
CancelledError when the caller is cancelled in the loop iteration in which the result lands. A
pump, monitor or stream loop cancelled so (`WorkerPool.stop` at shutdown, a client gone) would
run on, and `dspark-serve up` would not exit after SIGTERM."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """`awaitable`'s result, waited for at most `timeout_s` seconds (None: no bound); raises
    TimeoutError past it, and CancelledError whenever the caller is cancelled."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


async def answer_within(answer: concurrent.futures.Future[T], timeout_s: float | None) -> T:
    """`answer`, a result set on another thread (a Ray ref's future, an engine loop's call),
    waited for as `within` waits."""
    return await within(asyncio.wrap_future(answer), timeout_s)
