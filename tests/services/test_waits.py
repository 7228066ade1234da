"""services/waits.py: a bounded wait that the caller's cancellation always stops, also when it
comes in the loop iteration in which the awaited result lands (where Python 3.11's
`asyncio.wait_for` returns the result instead)."""

from __future__ import annotations

import asyncio

import pytest

from services.waits import within


def test_a_wait_cancelled_as_its_event_is_set_is_cancelled() -> None:
    async def main() -> None:
        event = asyncio.Event()
        task = asyncio.create_task(within(event.wait(), 5.0))
        await asyncio.sleep(0)  # the task waits on the event
        event.set()  # wakes the waiter: its resumption is queued
        task.cancel()  # in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_queue_item_that_lands_as_the_wait_is_cancelled_stays_in_the_queue() -> None:
    async def main() -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        task = asyncio.create_task(within(queue.get(), 5.0))
        await asyncio.sleep(0)
        queue.put_nowait("token")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert queue.get_nowait() == "token"  # nothing lost: the next reader gets it

    asyncio.run(main())


def test_the_result_and_the_timeout() -> None:
    async def main() -> None:
        assert await within(asyncio.sleep(0, result="done"), 1.0) == "done"
        with pytest.raises(TimeoutError):
            await within(asyncio.Event().wait(), 0.01)
        assert await within(asyncio.sleep(0.01, result="unbounded"), None) == "unbounded"

    asyncio.run(main())
