"""Incremental validation of one JSON value (RFC 8259) as its text arrives.

`JsonValueScanner` is a push-down automaton over characters. It looks at most one character
past a token (a number ends at the first character that cannot continue it) and waits when the
text runs out, so its verdict and every position it reports depend only on the text, never on
how the text was split into pieces. It builds no values: callers slice the text by position.
A `MemberListener` hears the members of a top-level object (key spans, value spans), which is
what the tool-call scanners need.

Stricter than `json.loads` in one respect, as RFC 8259 is: NaN and ±Infinity are rejected.
"""

from __future__ import annotations

import enum
import re
from typing import Protocol

WHITESPACE = frozenset(" \t\n\r")  # JSON's whitespace, which json.loads also uses
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_NUMBER_RUN = re.compile(r"[0-9eE.+\-]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_START = frozenset("-0123456789")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERAL_TAILS = {"t": "rue", "f": "alse", "n": "ull"}


class ScanStatus(enum.Enum):
    SCANNING = "scanning"
    DONE = "done"
    FAILED = "failed"


class _Expect(enum.Enum):
    VALUE = enum.auto()
    VALUE_OR_CLOSE = enum.auto()  # just after "["
    KEY_OR_CLOSE = enum.auto()  # just after "{"
    KEY = enum.auto()
    COLON = enum.auto()
    COMMA_OR_CLOSE = enum.auto()


class _Token(enum.Enum):
    NONE = enum.auto()
    STRING = enum.auto()
    ESCAPE = enum.auto()  # after a backslash inside a string
    UNICODE = enum.auto()  # inside the four hex digits of \uXXXX
    NUMBER = enum.auto()
    LITERAL = enum.auto()


class MemberListener(Protocol):
    """Hears the members of the top-level object. Returning False rejects the text there."""

    def member_key(self, text: str, start: int, end: int) -> bool:
        """A key was read: its JSON string, quotes included, is text[start:end]."""
        ...

    def member_value_start(self, text: str, pos: int) -> bool:
        """A member's value begins with text[pos]."""
        ...

    def member_value_end(self, text: str, start: int, end: int) -> bool:
        """A member's value was read: it is text[start:end]."""
        ...


class _AcceptEveryMember:
    def member_key(self, text: str, start: int, end: int) -> bool:
        return True

    def member_value_start(self, text: str, pos: int) -> bool:
        return True

    def member_value_end(self, text: str, start: int, end: int) -> bool:
        return True


class JsonValueScanner:
    """Validates one JSON value; positions are offsets into the caller's growing text."""

    def __init__(self, listener: MemberListener | None = None) -> None:
        self.status = ScanStatus.SCANNING
        self.end = -1  # DONE: just past the value; FAILED: the offending character
        self._listener = listener or _AcceptEveryMember()
        self._stack: list[str] = []  # the open containers, "{" or "["
        self._expect = _Expect.VALUE
        self._token = _Token.NONE
        self._token_start = 0  # where the current string or number began
        self._literal_tail = ""  # what the current true/false/null still needs
        self._hex_left = 0
        self._in_key = False
        self._member_start = 0  # where the current top-level member's value began

    def advance(self, text: str, pos: int) -> int:
        """Consume text[pos:] until the value ends, an error is found or the text runs out;
        return where it stopped."""
        n = len(text)
        while pos < n and self.status is ScanStatus.SCANNING:
            token = self._token
            if token is _Token.NONE:
                pos = self._structural(text, pos)
            elif token is _Token.STRING:
                match = _STRING_RUN.match(text, pos)
                pos = match.end() if match else pos
                if pos < n:
                    pos = self._string_special(text, pos)
            elif token is _Token.NUMBER:
                match = _NUMBER_RUN.match(text, pos)
                pos = match.end() if match else pos
                if pos < n:
                    self._end_number(text, pos)
            else:
                pos = self._escape_or_literal(text, pos)
        return pos

    def close(self, text: str) -> None:
        """The text ends here: a top-level number is complete; anything else unfinished fails."""
        if self.status is ScanStatus.SCANNING and self._token is _Token.NUMBER and not self._stack:
            self._end_number(text, len(text))
        if self.status is ScanStatus.SCANNING:
            self._fail(len(text))

    def _structural(self, text: str, pos: int) -> int:
        char = text[pos]
        if char in WHITESPACE:
            return pos + 1
        expect = self._expect
        if expect is _Expect.COLON:
            if char != ":":
                return self._fail(pos)
            self._expect = _Expect.VALUE
            return pos + 1
        if expect is _Expect.COMMA_OR_CLOSE:
            top = self._stack[-1]
            if char == ",":
                self._expect = _Expect.KEY if top == "{" else _Expect.VALUE
                return pos + 1
            if char == ("}" if top == "{" else "]"):
                return self._close_container(text, pos)
            return self._fail(pos)
        if expect is _Expect.KEY or expect is _Expect.KEY_OR_CLOSE:
            if char == '"':
                self._begin_string(pos, is_key=True)
                return pos + 1
            if char == "}" and expect is _Expect.KEY_OR_CLOSE:
                return self._close_container(text, pos)
            return self._fail(pos)
        if char == "]" and expect is _Expect.VALUE_OR_CLOSE:
            return self._close_container(text, pos)
        return self._begin_value(text, pos)

    def _begin_value(self, text: str, pos: int) -> int:
        char = text[pos]
        if self._at_member():
            if not self._listener.member_value_start(text, pos):
                return self._fail(pos)
            self._member_start = pos
        if char == "{" or char == "[":
            self._stack.append(char)
            self._expect = _Expect.KEY_OR_CLOSE if char == "{" else _Expect.VALUE_OR_CLOSE
        elif char == '"':
            self._begin_string(pos, is_key=False)
        elif char in _NUMBER_START:
            self._token = _Token.NUMBER
            self._token_start = pos
        elif char in _LITERAL_TAILS:
            self._token = _Token.LITERAL
            self._literal_tail = _LITERAL_TAILS[char]
        else:
            return self._fail(pos)
        return pos + 1

    def _begin_string(self, pos: int, is_key: bool) -> None:
        self._token = _Token.STRING
        self._token_start = pos
        self._in_key = is_key

    def _string_special(self, text: str, pos: int) -> int:
        char = text[pos]
        if char == "\\":
            self._token = _Token.ESCAPE
            return pos + 1
        if char != '"':  # a raw control character
            return self._fail(pos)
        self._token = _Token.NONE
        if not self._in_key:
            self._value_done(text, pos + 1)
            return pos + 1
        self._expect = _Expect.COLON
        if self._at_member_level() and not self._listener.member_key(text, self._token_start, pos + 1):
            return self._fail(pos + 1)
        return pos + 1

    def _escape_or_literal(self, text: str, pos: int) -> int:
        char = text[pos]
        if self._token is _Token.ESCAPE:
            if char == "u":
                self._token = _Token.UNICODE
                self._hex_left = 4
            elif char in _SIMPLE_ESCAPES:
                self._token = _Token.STRING
            else:
                return self._fail(pos)
        elif self._token is _Token.UNICODE:
            if char not in _HEX_DIGITS:
                return self._fail(pos)
            self._hex_left -= 1
            if self._hex_left == 0:
                self._token = _Token.STRING
        else:  # a literal
            if char != self._literal_tail[0]:
                return self._fail(pos)
            self._literal_tail = self._literal_tail[1:]
            if not self._literal_tail:
                self._token = _Token.NONE
                self._value_done(text, pos + 1)
        return pos + 1

    def _end_number(self, text: str, end: int) -> None:
        self._token = _Token.NONE
        if _NUMBER.fullmatch(text, self._token_start, end):
            self._value_done(text, end)
        else:
            self._fail(end)

    def _close_container(self, text: str, pos: int) -> int:
        self._stack.pop()
        self._value_done(text, pos + 1)
        return pos + 1

    def _value_done(self, text: str, end: int) -> None:
        if not self._stack:
            self.status = ScanStatus.DONE
            self.end = end
            return
        self._expect = _Expect.COMMA_OR_CLOSE
        if self._at_member_level() and not self._listener.member_value_end(text, self._member_start, end):
            self._fail(end)

    def _at_member_level(self) -> bool:
        """Inside the top-level object, outside any nested container."""
        return len(self._stack) == 1 and self._stack[0] == "{"

    def _at_member(self) -> bool:
        return self._expect is _Expect.VALUE and self._at_member_level()

    def _fail(self, pos: int) -> int:
        self.status = ScanStatus.FAILED
        self.end = pos
        return pos
