"""Scans one `{"name": ..., "arguments": ...}` object, the call syntax of most chat templates.

The arguments may be an object (its raw text, whitespace as written, becomes the call's
arguments) or a JSON string holding an object (the string's value becomes them). "parameters"
is accepted for "arguments"; other members are ignored. A second name or arguments member, a
name that is not a non-empty string, or a missing name or arguments makes the call malformed.
"""

from __future__ import annotations

import json

from services.gateway.tool_parsers.json_scan import JsonValueScanner, ScanStatus
from services.gateway.tool_parsers.scanner import CallInProgress, skip_whitespace

_NAME = "name"
_ARGUMENTS = "arguments"
_ARGUMENT_KEYS = frozenset({"arguments", "parameters"})


def _holds_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


class CallObjectScanner:
    """Reads one call object into `call`; `status` and `end` follow `JsonValueScanner`'s."""

    def __init__(self, call: CallInProgress) -> None:
        self.call = call
        self.status = ScanStatus.SCANNING
        self.end = -1  # DONE: just past the object; FAILED: where the text went wrong
        self._json = JsonValueScanner(listener=self)
        self._started = False
        self._member: str | None = None  # _NAME, _ARGUMENTS or another key
        self._seen: set[str] = set()
        self._arguments_open = False  # object arguments have begun and not yet ended

    def advance(self, text: str, pos: int) -> int:
        """Consume from `pos` (whitespace may lead); return where scanning stopped."""
        if not self._started:
            pos = skip_whitespace(text, pos)
            if pos == len(text):
                return pos
            if text[pos] != "{":
                return self._fail(pos)
            self._started = True
        pos = self._json.advance(text, pos)
        if self._arguments_open:
            self.call.arguments_end = pos
        if self._json.status is ScanStatus.FAILED:
            return self._fail(self._json.end)
        if self._json.status is ScanStatus.DONE:
            if self.call.name is None or _ARGUMENTS not in self._seen:
                return self._fail(self._json.end)
            self.status = ScanStatus.DONE
            self.end = self._json.end
        return pos

    def close(self, text: str) -> None:
        """The text ends here; an unfinished object fails."""
        if self.status is ScanStatus.SCANNING:
            self._fail(len(text))

    def member_key(self, text: str, start: int, end: int) -> bool:
        key = json.loads(text[start:end])
        member = _ARGUMENTS if key in _ARGUMENT_KEYS else key
        if member in (_NAME, _ARGUMENTS):
            if member in self._seen:
                return False
            self._seen.add(member)
        self._member = member
        return True

    def member_value_start(self, text: str, pos: int) -> bool:
        first = text[pos]
        if self._member == _NAME:
            return first == '"'
        if self._member == _ARGUMENTS:
            if first == "{":
                self.call.arguments_start = self.call.arguments_end = pos
                self._arguments_open = True
                return True
            return first == '"'
        return True

    def member_value_end(self, text: str, start: int, end: int) -> bool:
        if self._member == _NAME:
            name = json.loads(text[start:end])
            if not name.strip():
                return False
            self.call.name = name
        elif self._member == _ARGUMENTS:
            if self._arguments_open:
                self._arguments_open = False
                self.call.arguments_end = end
                return True
            value = json.loads(text[start:end])
            if not _holds_object(value):
                return False
            self.call.decoded_arguments = value
        return True

    def _fail(self, at: int) -> int:
        self.status = ScanStatus.FAILED
        self.end = at
        return at
