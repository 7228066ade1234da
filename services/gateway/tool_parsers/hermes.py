"""Hermes-style calls (Qwen2.5, Qwen3, SmolLM3, Hermes 2/3): zero or more
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks; the text outside
the blocks is content.

A block whose object is malformed stays content, tags included. The last block may lack its
closing tag when nothing but whitespace follows its object (some models stop right there).
"""

from __future__ import annotations

import enum

from services.gateway.tool_parsers.call_object import CallObjectScanner
from services.gateway.tool_parsers.json_scan import ScanStatus
from services.gateway.tool_parsers.parser import ToolParser
from services.gateway.tool_parsers.scanner import OutputScanner, skip_whitespace

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class _State(enum.Enum):
    CONTENT = enum.auto()
    OBJECT = enum.auto()
    CLOSE_TAG = enum.auto()


class HermesScanner(OutputScanner):
    def __init__(self) -> None:
        super().__init__()
        self._state = _State.CONTENT
        self._object: CallObjectScanner | None = None

    def _advance(self, final: bool) -> None:
        while True:
            if self._state is _State.CONTENT:
                start = self._content_before(OPEN_TAG, final)
                if start is None:
                    return
                self._object = CallObjectScanner(self._open_call(start))
                self.pos = start + len(OPEN_TAG)
                self._state = _State.OBJECT
                continue
            scanner = self._object
            assert scanner is not None
            if self._state is _State.OBJECT:
                self.pos = scanner.advance(self.text, self.pos)
                if final:
                    scanner.close(self.text)
                if scanner.status is ScanStatus.SCANNING:
                    return
                if scanner.status is ScanStatus.FAILED:
                    self._fail_call(scanner.call, scanner.end)
                    self._state = _State.CONTENT
                    continue
                self.pos = scanner.end
                self._state = _State.CLOSE_TAG
            tag_at = skip_whitespace(self.text, self.pos)
            rest = self.text[tag_at : tag_at + len(CLOSE_TAG)]
            if rest == CLOSE_TAG:
                self._complete_call(scanner.call, tag_at + len(CLOSE_TAG))
            elif final and tag_at == len(self.text):
                self._complete_call(scanner.call, tag_at)
            elif CLOSE_TAG.startswith(rest) and not final:
                return
            else:
                self._fail_call(scanner.call, tag_at)
            self._state = _State.CONTENT


class HermesToolParser(ToolParser):
    name = "hermes"
    scanner_class = HermesScanner
