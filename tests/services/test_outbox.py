"""The outbox's long polls: a cancelled poll leaves no waiter behind, and waking the poller of
a gateway whose event loop has closed is never an error for the engine's step thread."""

from __future__ import annotations

import asyncio

import pytest

from services.workers.outbox import Outbox


def test_a_cancelled_poll_leaves_no_waiter() -> None:
    outbox = Outbox()

    async def poll_then_cancel() -> None:
        task = asyncio.create_task(outbox.take("gw", timeout_s=30))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(poll_then_cancel())
    assert not outbox._waiters.get("gw")
    outbox.drop("gw")  # after the loop closed: nothing to wake, nothing raised


def test_waking_a_poller_on_a_closed_loop_is_skipped() -> None:
    outbox = Outbox()
    loop = asyncio.new_event_loop()
    outbox._waiters["gw"].append((loop, asyncio.Event()))
    loop.close()
    outbox.drop("gw")
    outbox._waiters["gw2"].append((loop, asyncio.Event()))
    outbox.put_many({"gw2": [object()]})  # type: ignore[list-item]
    assert outbox.buffered("gw2") == 1


def test_a_poll_returns_what_arrives_while_it_waits() -> None:
    outbox = Outbox()

    async def scenario() -> list[object]:
        task = asyncio.create_task(outbox.take("gw", timeout_s=5))
        await asyncio.sleep(0.05)
        outbox.put_many({"gw": ["event"]})  # type: ignore[list-item]
        return list(await task)

    assert asyncio.run(scenario()) == ["event"]
    assert not outbox._waiters.get("gw")
