"""A streaming response that always watches for the client going away.

Starlette only listens for `http.disconnect` under ASGI spec < 2.4; on newer servers a
disconnect is noticed at the next write. Watching `receive` ourselves makes both behave the
same: the body iterator is cancelled as soon as the client disconnects, and its `finally`
aborts the request on the workers.
"""

from __future__ import annotations

import contextlib

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


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
