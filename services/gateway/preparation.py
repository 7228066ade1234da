"""The CPU work on request bodies, off the event loop (docs/design.md §6.8).

Decoding a body's JSON, validating it, rendering the chat template and tokenising take
seconds for a body near the size limit; on the event loop they would stall every open
stream. They run here instead, on a small pool of threads: at most `threads` bodies are
prepared at once and the rest wait their turn, so a burst of large bodies costs a bounded
number of cores and never the loop. Work that has not started when its request is cancelled
(the client left) never runs; work already running is told through `on_cancel`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class PreparationPool:
    def __init__(self, threads: int) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="gateway-prepare")

    async def run(self, fn: Callable[..., T], *args: Any, on_cancel: Callable[[], None] | None = None) -> T:
        future = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        try:
            return await future
        except asyncio.CancelledError:
            if on_cancel is not None:
                on_cancel()
            raise

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
