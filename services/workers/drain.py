"""A worker's drain with a grace (docs/design.md §6.9): the timeline from "take no new
requests" to "empty", run on the worker actor's event loop."""

from __future__ import annotations

import asyncio
import time

from services.workers.engine_loop import EngineLoop

POLL_S = 0.05  # how often the held count (the step thread's stats snapshot) is read


async def drain_within(loop: EngineLoop, grace_s: float) -> None:
    """Take no new requests, give the held ones `grace_s` seconds to finish, then hand the rest
    back to their gateways to move elsewhere. Returns only once the worker holds nothing, so
    that whoever called it may stop the worker (`dspark-serve drain`, then `ray stop`)."""
    loop.drain()
    deadline = time.monotonic() + grace_s
    while loop.stats().num_held and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    # The hand-back runs on the step thread, between two steps. Evicting again until the count
    # reads 0 also hands back a KV hand-off that was still arriving at the first eviction.
    while loop.stats().num_held and loop.alive:
        loop.evict()
        await asyncio.sleep(POLL_S)
