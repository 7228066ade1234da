"""A connection must send each request's headers within a time limit (docs/design.md §6.8).

Uvicorn bounds only the idle time between the requests of a keep-alive connection
(`timeout_keep_alive`): a client that opens a connection and sends nothing, or sends its
headers a byte at a time, holds a connection and its buffers for as long as it likes.
`header_timeout_protocol` is uvicorn's h11 protocol with a timer armed while the connection
waits for a request's headers (from the moment it opens, and from the first byte of each
later request) and disarmed once they are complete; when it fires, the client gets a 408 and
the connection is closed. The body has its own limit, in the app (body.read_body).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """Uvicorn's h11 protocol closing connections whose headers take over `timeout_s`
    (pass it as `uvicorn.Config(http=...)`)."""
    if timeout_s <= 0:
        raise ValueError(f"header timeout must be > 0, got {timeout_s}")

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:  # part of a request's headers so far
                self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(_TIMED_OUT)
                self.transport.close()

    return HeaderTimeoutProtocol
