"""What the tool parsers give their caller: whole-output results and streamed deltas."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IdFactory = Callable[[], str]


def new_call_id() -> str:
    """An OpenAI-style tool call id: `call_` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text of the arguments object (OpenAI sends a string)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None  # None when nothing but whitespace surrounds the calls
    tool_calls: list[ToolCall]

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.tool_calls)


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed piece of a tool call. The first piece of a call carries its id and name and
    empty arguments; every later piece carries only more of the arguments text."""

    index: int  # the call's position among the choice's tool calls
    id: str | None
    name: str | None
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


Delta = ContentDelta | ToolCallDelta


def tool_finish_reason(finish_reason: str, has_tool_calls: bool) -> str:
    """OpenAI reports "tool_calls" when a choice that stopped naturally called tools; a choice cut
    short ("length", "abort") keeps its reason."""
    return "tool_calls" if has_tool_calls and finish_reason == "stop" else finish_reason
