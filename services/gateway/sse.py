"""Server-sent events framing for streamed completions (the OpenAI wire format)."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One `data:` event. JSON never contains a raw newline, so one line suffices."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_comment(text: str = "") -> bytes:
    """A comment line: ignored by clients, keeps idle connections alive."""
    return b": " + text.replace("\n", " ").encode() + b"\n\n"
