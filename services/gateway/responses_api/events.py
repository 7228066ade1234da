"""The Responses API's shape of one generation (docs/design.md §6.7): the chat formatter's
chunks (content, and tool calls already parsed into OpenAI deltas by `chat_tool_calls.py`)
re-shaped into Responses stream events, and its whole body into a response object.

A stream is `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, its content (`response.content_part.added`,
`response.output_text.delta`..., `.done`, `response.content_part.done`; or for a call
`response.function_call_arguments.delta`..., `.done`), `response.output_item.done`, and
last `response.completed` (or `response.incomplete`) carrying the whole response. Each event
is `event: <type>` plus `data: <json>` with a `sequence_number` counting from 0; there is no
`[DONE]`. A failure after the start is one `error` event, and the stream ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.gateway.errors import APIError
from services.gateway.responses import Usage
from services.gateway.responses_api.objects import (
    ResponseShape,
    function_call_item,
    message_item,
    new_object_id,
    output_text_part,
)
from services.gateway.wire_format import WireFormat


@dataclass
class _StreamedItem:
    """An output item as it is streamed: a message (its text) or a call (its arguments)."""

    item_id: str
    output_index: int
    call_id: str | None = None  # None: a message
    name: str = ""
    text: str = ""  # the message's text, or the call's arguments so far
    status: str = "in_progress"

    def body(self, started: bool = True) -> dict[str, Any]:
        if self.call_id is None:
            return message_item(self.item_id, self.text if started else None, self.status)
        return function_call_item(self.item_id, self.call_id, self.name, self.text, self.status)


class ResponsesWire(WireFormat):
    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape
        self._sequence = 0
        self._items: list[_StreamedItem] = []
        self._open: _StreamedItem | None = None
        self._cut_short = False  # the output reached its token limit

    # -- streams ----------------------------------------------------------------------------

    def opening(self) -> bytes:
        in_progress = self.shape.body("in_progress", [], None)
        return self._event("response.created", response=in_progress) + self._event(
            "response.in_progress", response=in_progress
        )

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        events: list[bytes] = []
        for choice in chunk["choices"]:  # one: n is always 1 here
            delta = choice.get("delta", {})
            if delta.get("content"):
                self._text(delta["content"], events)
            for call in delta.get("tool_calls", ()):
                if call.get("id") is not None:  # a call's first delta: its id and name
                    self._start_call(call["id"], call["function"]["name"], events)
                if call["function"].get("arguments"):
                    self._arguments(call["function"]["arguments"], events)
            if choice.get("finish_reason") == "length":
                self._cut_short = True
        return b"".join(events)

    def failure(self, error: APIError) -> bytes:
        return self._event("error", code=error.code, message=error.message, param=error.param)

    def closing(self, usage: Usage) -> bytes:
        events: list[bytes] = []
        if not self._items:  # nothing was generated: an empty message, as a whole response has
            self._start_message(events)
        self._close(events)
        status = "incomplete" if self._cut_short else "completed"
        output = [item.body() for item in self._items]
        events.append(self._event(f"response.{status}", response=self.shape.body(status, output, usage)))
        return b"".join(events)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def _start(self, item: _StreamedItem, events: list[bytes]) -> None:
        self._close(events)
        self._items.append(item)
        self._open = item
        events.append(self._event("response.output_item.added", output_index=item.output_index, item=item.body(False)))

    def _start_message(self, events: list[bytes]) -> None:
        item = _StreamedItem(new_object_id("msg"), len(self._items))
        self._start(item, events)
        events.append(self._event("response.content_part.added", **self._where(item), part=output_text_part("")))

    def _start_call(self, call_id: str, name: str, events: list[bytes]) -> None:
        self._start(_StreamedItem(new_object_id("fc"), len(self._items), call_id, name), events)

    def _text(self, text: str, events: list[bytes]) -> None:
        if self._open is None or self._open.call_id is not None:
            self._start_message(events)
        assert self._open is not None
        self._open.text += text
        events.append(self._event("response.output_text.delta", **self._where(self._open), delta=text, logprobs=[]))

    def _arguments(self, piece: str, events: list[bytes]) -> None:
        item = self._open
        assert item is not None and item.call_id is not None, "argument deltas follow their call's first delta"
        item.text += piece
        events.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=item.item_id,
                output_index=item.output_index,
                delta=piece,
            )
        )

    def _close(self, events: list[bytes]) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        # an item still open when the output was cut short is the one that was cut
        item.status = "incomplete" if self._cut_short else "completed"
        if item.call_id is None:
            where = self._where(item)
            events.append(self._event("response.output_text.done", **where, text=item.text, logprobs=[]))
            events.append(self._event("response.content_part.done", **where, part=output_text_part(item.text)))
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    name=item.name,
                    arguments=item.text,
                )
            )
        events.append(self._event("response.output_item.done", output_index=item.output_index, item=item.body()))

    @staticmethod
    def _where(item: _StreamedItem) -> dict[str, Any]:
        return {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}

    # -- whole responses --------------------------------------------------------------------

    def whole(self, body: dict[str, Any], usage: Usage) -> dict[str, Any]:
        """The response object of a chat completion body (its one choice)."""
        choice = body["choices"][0]
        message = choice["message"]
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        calls = message.get("tool_calls") or []
        output: list[dict[str, Any]] = []
        if message.get("content") or not calls:
            output.append(message_item(new_object_id("msg"), message.get("content") or "", status))
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            output.append(function_call_item(new_object_id("fc"), call["id"], name, arguments, "completed"))
        return self.shape.body(status, output, usage)
