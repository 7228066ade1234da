"""Reading a request body, refusing what would otherwise surface as a 5xx later.

`read_body` runs on the event loop: 413 when the body passes the size limit, 408 when it does
not arrive within the body timeout, 499 when the client leaves while sending it.
`parse_json_object` is CPU work on the whole body, run off the loop (preparation.py): 400 on
invalid UTF-8, invalid JSON, NaN/Infinity, excessive nesting and lone surrogates.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from services.gateway.errors import ClientClosedRequest, InvalidRequest, RequestTimeout, RequestTooLarge

MAX_DEPTH = 64


async def read_body(request: Request, limit_bytes: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise RequestTooLarge(limit_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit_bytes:
                    raise RequestTooLarge(limit_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(timeout_s) from None
    except ClientDisconnect:
        raise ClientClosedRequest(f"The client closed the connection after {size} bytes of the body.") from None
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid UTF-8 (byte {exc.start}).", code="invalid_encoding"
        ) from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    _check_strings(body, 0)
    return body


def _check_strings(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"The request body is nested deeper than {MAX_DEPTH} levels.", code="invalid_json")
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_strings(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, depth + 1)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            "The request body contains an unpaired UTF-16 surrogate escape.", code="invalid_encoding"
        ) from None
