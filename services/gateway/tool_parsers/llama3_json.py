"""Llama 3.x JSON calls: the whole message is (optionally after `<|python_tag|>`) one call object
`{"name": ..., "parameters": {...}}` ("arguments" also accepted), or several separated by `;`.

Only an output that starts, after whitespace, with `{` or the python tag holds calls; any other
output is all content. From the first object that is not a well-formed call, or the first text
that is neither a separator nor a call, the rest of the output is content.
"""

from __future__ import annotations

import enum
import re

from services.gateway.tool_parsers.call_object import CallObjectScanner
from services.gateway.tool_parsers.json_scan import ScanStatus
from services.gateway.tool_parsers.parser import ToolParser
from services.gateway.tool_parsers.scanner import OutputScanner, skip_whitespace

PYTHON_TAG = "<|python_tag|>"
_SEPARATOR = re.compile(r"[ \t\n\r]*(;[ \t\n\r]*)?")


class _State(enum.Enum):
    START = enum.auto()
    OBJECT = enum.auto()
    BETWEEN = enum.auto()  # after a call: a separator and another call, or the end
    CONTENT = enum.auto()


class Llama3JsonScanner(OutputScanner):
    def __init__(self) -> None:
        super().__init__()
        self._state = _State.START
        self._object: CallObjectScanner | None = None

    def _advance(self, final: bool) -> None:
        while True:
            if self._state is _State.START:
                self._content_to(skip_whitespace(self.text, self.pos))
                head = self.text[self.pos : self.pos + len(PYTHON_TAG)]
                if head.startswith("{"):
                    self._begin_call(self.pos, self.pos)
                elif head == PYTHON_TAG:
                    self._begin_call(self.pos, self.pos + len(PYTHON_TAG))
                elif PYTHON_TAG.startswith(head) and not final:
                    return  # nothing yet, or what may be the start of the tag
                else:
                    self._state = _State.CONTENT
            elif self._state is _State.OBJECT:
                scanner = self._object
                assert scanner is not None
                self.pos = scanner.advance(self.text, self.pos)
                if final:
                    scanner.close(self.text)
                if scanner.status is ScanStatus.SCANNING:
                    return
                if scanner.status is ScanStatus.FAILED:
                    self._fail_call(scanner.call, scanner.end)
                    self._state = _State.CONTENT
                else:
                    self._complete_call(scanner.call, scanner.end)
                    self._state = _State.BETWEEN
            elif self._state is _State.BETWEEN:
                separator = _SEPARATOR.match(self.text, self.pos)
                assert separator is not None  # the pattern matches the empty string
                after = separator.end()
                if after == len(self.text) and not final:
                    return
                if separator.group(1) and after < len(self.text) and self.text[after] == "{":
                    self._begin_call(self.pos, after)
                else:
                    self._state = _State.CONTENT
            else:
                self._content_to(len(self.text))
                return

    def _begin_call(self, segment_start: int, object_start: int) -> None:
        self._object = CallObjectScanner(self._open_call(segment_start))
        self.pos = object_start
        self._state = _State.OBJECT


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    scanner_class = Llama3JsonScanner
