"""How a generation's bodies reach the client (the `wire` of a `serving.Generation`).

The formatters (`responses.py`) write OpenAI's chat and legacy completion bodies. `WireFormat`
sends them as they are: whole as JSON, streamed as `data:` events closed by `[DONE]`. An API
of another shape over the same generation subclasses it to re-shape those bodies, so that the
one stream loop in `serving.py` serves it too (the Responses API: `responses_api/events.py`).
"""

from __future__ import annotations

from typing import Any

from services.gateway.errors import APIError
from services.gateway.responses import Usage
from services.gateway.sse import DONE, sse_event


class WireFormat:
    def opening(self) -> bytes:
        """What a stream sends before any choice's first chunk."""
        return b""

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        """One formatted chunk of a stream (b"" sends nothing)."""
        return sse_event(chunk)

    def failure(self, error: APIError) -> bytes:
        """What a stream that fails after it has started sends last: the error, then `[DONE]`,
        so that a client sees the stream end rather than a cut body."""
        return sse_event(error.body()) + DONE

    def closing(self, usage: Usage) -> bytes:
        """What a stream sends after every choice has finished."""
        return DONE

    def whole(self, body: dict[str, Any], usage: Usage) -> dict[str, Any]:
        """The body of a whole (not streamed) response."""
        return body
