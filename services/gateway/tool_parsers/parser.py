"""`ToolParser`: the one interface every tool-call format sits behind.

The arguments rule, shared by every format and both paths: a call's `arguments` string is the
model's own JSON text of the arguments object, whitespace as written (or the value of the JSON
string, when the model wrote the arguments as a string holding an object). Nothing is
re-serialised, so the streamed pieces concatenate to exactly what `parse` returns.
"""

from __future__ import annotations

from typing import ClassVar

from services.gateway.tool_parsers.output import IdFactory, ParsedOutput, ToolCall, new_call_id
from services.gateway.tool_parsers.scanner import CallInProgress, CallState, OutputScanner
from services.gateway.tool_parsers.stream import ToolCallStream


class ToolParser:
    """Parses one model family's tool-call syntax out of generated text.

    `parse` reads a whole output; `stream` gives a per-choice incremental parser. Ids come from
    `new_id` (uuid-based unless the caller passes its own, as tests do), one per call, in order.
    """

    name: ClassVar[str]
    scanner_class: ClassVar[type[OutputScanner]]

    def __init__(self, new_id: IdFactory = new_call_id) -> None:
        self._new_id = new_id

    def parse(self, text: str) -> ParsedOutput:
        scanner = self.scanner_class()
        scanner.feed(text)
        scanner.finish()
        content = "".join(item for item in scanner.items if isinstance(item, str))
        calls = [
            _tool_call(item, scanner.text, self._new_id())
            for item in scanner.items
            if isinstance(item, CallInProgress) and item.state is CallState.COMPLETE
        ]
        return ParsedOutput(content=None if calls and not content.strip() else content, tool_calls=calls)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.scanner_class(), self._new_id)


def _tool_call(call: CallInProgress, text: str, call_id: str) -> ToolCall:
    arguments = call.arguments(text)
    assert call.name is not None and arguments is not None, "a complete call has a name and arguments"
    return ToolCall(id=call_id, name=call.name, arguments=arguments)
