"""Mistral calls: `[TOOL_CALLS]` then a JSON list of `{"name": ..., "arguments": {...}}` objects
(v3 tokenizers), or `[TOOL_CALLS]name[ARGS]{...}` once per call (v11 and later). Text before
a `[TOOL_CALLS]`, and after its list or arguments, is content.

A malformed element ends the list: its text, and whatever follows, is content again, while the
elements before it stay calls.
"""

from __future__ import annotations

import enum
import re

from services.gateway.tool_parsers.call_object import CallObjectScanner
from services.gateway.tool_parsers.json_scan import JsonValueScanner, ScanStatus
from services.gateway.tool_parsers.parser import ToolParser
from services.gateway.tool_parsers.scanner import CallInProgress, OutputScanner, skip_whitespace

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME_RUN = re.compile(r"[A-Za-z0-9_.\-]*")


class _State(enum.Enum):
    CONTENT = enum.auto()
    AFTER_MARKER = enum.auto()  # a list or a name follows
    LIST_OBJECT = enum.auto()
    LIST_BETWEEN = enum.auto()  # after an element: "," and another, or "]"
    NAME = enum.auto()
    ARGUMENTS = enum.auto()


class MistralScanner(OutputScanner):
    def __init__(self) -> None:
        super().__init__()
        self._state = _State.CONTENT
        self._call = CallInProgress(segment_start=0)  # replaced at each marker
        self._object: CallObjectScanner | None = None
        self._arguments = JsonValueScanner()  # replaced at each [ARGS]
        self._name_start = 0

    def _advance(self, final: bool) -> None:
        while self._step(final):
            pass

    def _step(self, final: bool) -> bool:
        """Take one decision; False when waiting for more text (or when all is decided)."""
        state, text = self._state, self.text
        if state is _State.CONTENT:
            start = self._content_before(TOOL_CALLS, final)
            if start is None:
                return False
            self._call = self._open_call(start)
            self.pos = start + len(TOOL_CALLS)
            self._state = _State.AFTER_MARKER
        elif state is _State.AFTER_MARKER:
            first = skip_whitespace(text, self.pos)
            if first == len(text):
                if not final:
                    return False
                self._fail(first)
                return True
            if text[first] == "[":
                self._begin_list_object(first + 1)
            else:
                self._name_start = first
                self._state = _State.NAME
        elif state is _State.LIST_OBJECT:
            return self._list_object(final)
        elif state is _State.LIST_BETWEEN:
            after = skip_whitespace(text, self.pos)
            if after == len(text) and not final:
                return False
            if after < len(text) and text[after] == ",":
                self._call = self._open_call(self.pos)
                self._begin_list_object(after + 1)
            elif after < len(text) and text[after] == "]":
                self.pos = after + 1
                self._state = _State.CONTENT
            else:
                self._state = _State.CONTENT
        elif state is _State.NAME:
            return self._name(final)
        else:
            return self._arguments_object(final)
        return True

    def _begin_list_object(self, pos: int) -> None:
        self._object = CallObjectScanner(self._call)
        self.pos = pos
        self._state = _State.LIST_OBJECT

    def _list_object(self, final: bool) -> bool:
        scanner = self._object
        assert scanner is not None
        self.pos = scanner.advance(self.text, self.pos)
        if final:
            scanner.close(self.text)
        if scanner.status is ScanStatus.SCANNING:
            return False
        if scanner.status is ScanStatus.FAILED:
            self._fail(scanner.end)
        else:
            self._complete_call(self._call, scanner.end)
            self._state = _State.LIST_BETWEEN
        return True

    def _name(self, final: bool) -> bool:
        text = self.text
        match = _NAME_RUN.match(text, self._name_start)
        name_end = match.end() if match else self._name_start
        rest = text[name_end : name_end + len(ARGS)]
        if rest == ARGS and name_end > self._name_start:
            self._call.name = text[self._name_start : name_end]
            self.pos = name_end + len(ARGS)
            self._arguments = JsonValueScanner()
            self._state = _State.ARGUMENTS
        elif len(rest) < len(ARGS) and ARGS.startswith(rest) and not final:
            return False
        else:
            self._fail(name_end)
        return True

    def _arguments_object(self, final: bool) -> bool:
        call, text = self._call, self.text
        if call.arguments_start is None:
            first = skip_whitespace(text, self.pos)
            if first == len(text) and not final:
                return False
            if first == len(text) or text[first] != "{":
                self._fail(first)
                return True
            call.arguments_start = first
            self.pos = first
        self.pos = call.arguments_end = self._arguments.advance(text, self.pos)
        if final:
            self._arguments.close(text)
        if self._arguments.status is ScanStatus.SCANNING:
            return False
        if self._arguments.status is ScanStatus.FAILED:
            self._fail(self._arguments.end)
        else:
            call.arguments_end = self._arguments.end
            self._complete_call(call, self._arguments.end)
            self._state = _State.CONTENT
        return True

    def _fail(self, at: int) -> None:
        self._fail_call(self._call, at)
        self._state = _State.CONTENT


class MistralToolParser(ToolParser):
    name = "mistral"
    scanner_class = MistralScanner
