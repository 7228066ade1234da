"""The shared machinery of the format scanners: one model output, split into content and calls.

A format scanner reads the output as it arrives and appends to `items`, in text order, content
pieces and `CallInProgress` records. Its rule: it decides a character only when every character
the decision depends on has arrived (or the output has finished), and what it has appended is
never taken back. The one exception is a call's own record, which grows while the call is open
and is marked FAILED if the call turns out malformed; the call's text is then appended as
content. Whole-output parsing and streaming both read `items`, so they agree by construction.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass

from services.gateway.tool_parsers.json_scan import WHITESPACE


class CallState(enum.Enum):
    OPEN = "open"
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass
class CallInProgress:
    """One tool call as its text arrives. Its format scanner is the only writer."""

    segment_start: int  # the call's text, markers included, begins here
    name: str | None = None
    arguments_start: int | None = None  # arguments written as an object: text[start:end] so far
    arguments_end: int | None = None
    decoded_arguments: str | None = None  # arguments written as a JSON string, once read whole
    state: CallState = CallState.OPEN

    def arguments(self, text: str, skip: int = 0) -> str | None:
        """The arguments text read so far, from its character `skip` on; None until it begins."""
        if self.decoded_arguments is not None:
            return self.decoded_arguments[skip:]
        if self.arguments_start is None or self.arguments_end is None:
            return None
        return text[self.arguments_start + skip : self.arguments_end]

    @property
    def announceable(self) -> bool:
        """The name is known and the arguments have begun: a stream may announce the call."""
        return self.name is not None and (self.decoded_arguments is not None or self.arguments_start is not None)


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in WHITESPACE:
        pos += 1
    return pos


def partial_marker_length(text: str, marker: str, start: int) -> int:
    """The length of the longest tail of text[start:] that is a proper prefix of `marker`."""
    for length in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


class OutputScanner(ABC):
    """Splits one model output into content and tool calls as its text arrives."""

    def __init__(self) -> None:
        self.text = ""
        self.items: list[str | CallInProgress] = []  # content pieces and calls, in text order
        self.pos = 0  # text[:pos] is decided

    def feed(self, new_text: str) -> None:
        self.text += new_text
        self._advance(final=False)

    def finish(self) -> None:
        """The output has ended: decide everything that is left."""
        self._advance(final=True)

    @abstractmethod
    def _advance(self, final: bool) -> None:
        """Decide as much of text[pos:] as possible (all of it when `final`)."""

    def _content_to(self, end: int) -> None:
        if end > self.pos:
            self.items.append(self.text[self.pos : end])
            self.pos = end

    def _content_before(self, marker: str, final: bool) -> int | None:
        """Content up to the next `marker`; return where it starts, or None when it has not
        arrived. A tail that could begin the marker is held back until the output ends."""
        at = self.text.find(marker, self.pos)
        if at >= 0:
            self._content_to(at)
            return at
        held = 0 if final else partial_marker_length(self.text, marker, self.pos)
        self._content_to(len(self.text) - held)
        return None

    def _open_call(self, segment_start: int) -> CallInProgress:
        call = CallInProgress(segment_start=segment_start)
        self.items.append(call)
        return call

    def _complete_call(self, call: CallInProgress, end: int) -> None:
        call.state = CallState.COMPLETE
        self.pos = end

    def _fail_call(self, call: CallInProgress, at: int) -> None:
        """The call is malformed: its text up to `at` is content, and scanning resumes at `at`."""
        call.state = CallState.FAILED
        if at > call.segment_start:
            self.items.append(self.text[call.segment_start : at])
        self.pos = at
