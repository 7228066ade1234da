"""Watching for the client going away, from its request's last body byte to its response's.

`until_disconnect` covers the admission of a request (validation, tokenising, submitting its
choices): the client leaving cancels it. `DisconnectAwareStreamingResponse` covers a stream:
Starlette only listens for `http.disconnect` under ASGI spec < 2.4; on newer servers a
disconnect is noticed at the next write. Watching `receive` ourselves makes both behave the
same: the body iterator is cancelled as soon as the client disconnects, and its `finally`
aborts the request on the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.gateway.errors import ClientClosedRequest

T = TypeVar("T")


class DisconnectAwareStreamingResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream_then_stop() -> None:
                with contextlib.suppress(OSError):  # the connection broke while writing
                    await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream_then_stop)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()
        if self.background is not None:
            await self.background()


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client closes the connection (the request body must be read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientClosedRequest (499) when the client disconnects first: `work`
    is then cancelled and awaited, so whatever it started is undone before this returns. Work
    that finishes anyway is returned; what follows (the response) notices the disconnect
    itself. The request body must have been read."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # cancelled from outside, not by the client
            raise
        raise ClientClosedRequest("The client closed the connection before the response was ready.") from None
