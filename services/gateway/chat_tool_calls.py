"""A chat choice's text as OpenAI tool calls (docs/design.md §6.6): whole responses parse the
full text; streams feed each piece to a per-choice incremental parser and send its deltas
(content, a call's id and name, then its arguments in pieces), merged per chunk.
"""

from __future__ import annotations

from typing import Any

from services.gateway.tool_parsers import ContentDelta, Delta, ToolCallStream, ToolParser, tool_finish_reason


class ChoiceToolCalls:
    """Tool-call parsing of every choice of one response."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self._streams: dict[int, ToolCallStream] = {}

    def feed(self, index: int, text: str) -> dict[str, Any]:
        """The delta fields for a new piece of choice `index`'s text ({} when the parser holds
        it back)."""
        return _delta_fields(self._stream(index).feed(text))

    def finish(self, index: int, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """What the parser still holds when the choice ends, and its OpenAI finish reason."""
        stream = self._stream(index)
        fields = _delta_fields(stream.finish())
        reason = tool_finish_reason(finish_reason, stream.has_tool_calls) if finish_reason else finish_reason
        return fields, reason

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The whole message of a choice and its finish reason."""
        parsed = self.parser.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None}
        if parsed.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
        reason = tool_finish_reason(finish_reason, parsed.has_tool_calls) if finish_reason else finish_reason
        return message, reason

    def _stream(self, index: int) -> ToolCallStream:
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = self.parser.stream()
        return stream


def _delta_fields(deltas: list[Delta]) -> dict[str, Any]:
    """Deltas merged into one chunk's fields: the content pieces joined, and one entry per call
    (its announcement with the arguments that follow it, or just more arguments)."""
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            continue
        if calls and calls[-1]["index"] == delta.index and delta.id is None:
            calls[-1]["function"]["arguments"] += delta.arguments
        else:
            calls.append(delta.to_openai())
    fields: dict[str, Any] = {}
    if content:
        fields["content"] = content
    if calls:
        fields["tool_calls"] = calls
    return fields
