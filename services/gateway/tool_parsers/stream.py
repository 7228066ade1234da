"""`ToolCallStream`: one choice's output, piece by piece, as OpenAI content and tool-call deltas.

What the deltas promise, for any way the output is split into pieces:
- content deltas concatenate to `parse(output).content` ("" where that is None): content that is
  only whitespace is held until something else arrives, since whitespace alone around calls
  is no content at all;
- each call is announced (id, name, empty arguments) once its name is complete and its
  arguments have begun, and its argument pieces concatenate to `parse(output)`'s arguments.
A call that turns out malformed after it was announced cannot be taken back: its pieces stop,
its text arrives as content (as `parse` reports it), and it is missing from `parse`'s calls.
"""

from __future__ import annotations

from services.gateway.tool_parsers.output import ContentDelta, Delta, IdFactory, ToolCallDelta
from services.gateway.tool_parsers.scanner import CallInProgress, CallState, OutputScanner


class ToolCallStream:
    def __init__(self, scanner: OutputScanner, new_id: IdFactory) -> None:
        self._scanner = scanner
        self._new_id = new_id
        self._next_item = 0  # scanner.items before this one have been turned into deltas
        self._held_blank: list[str] = []  # whitespace content, while nothing else has come
        self._content_started = False
        self._announced = 0  # calls announced so far; the next one gets this index
        self._current_index: int | None = None  # stream index of the open call, once announced
        self._arguments_sent = 0  # characters of the open call's arguments sent
        self._completed = 0  # complete calls passed

    @property
    def has_tool_calls(self) -> bool:
        """Whether the output so far holds a complete call (as `parse` would report)."""
        return self._completed > 0

    def feed(self, new_text: str) -> list[Delta]:
        self._scanner.feed(new_text)
        return self._deltas()

    def finish(self) -> list[Delta]:
        """The output has ended: the held tail is decided and the last deltas are returned."""
        self._scanner.finish()
        deltas = self._deltas()
        if self._held_blank and not self._completed:
            deltas.append(ContentDelta("".join(self._held_blank)))
            self._held_blank.clear()
        return deltas

    def _deltas(self) -> list[Delta]:
        deltas: list[Delta] = []
        items = self._scanner.items
        while self._next_item < len(items):
            item = items[self._next_item]
            if isinstance(item, str):
                self._content(item, deltas)
            else:
                self._call(item, deltas)
                if item.state is CallState.OPEN:
                    break  # an open call is always the last item
                if item.state is CallState.COMPLETE:
                    self._completed += 1
                self._current_index = None
                self._arguments_sent = 0
            self._next_item += 1
        return deltas

    def _content(self, text: str, deltas: list[Delta]) -> None:
        if self._content_started:
            deltas.append(ContentDelta(text))
        elif not text.strip():
            self._held_blank.append(text)
        else:
            self._content_started = True
            deltas.append(ContentDelta("".join(self._held_blank) + text))
            self._held_blank.clear()

    def _call(self, call: CallInProgress, deltas: list[Delta]) -> None:
        if call.state is CallState.FAILED:
            return
        if self._current_index is None:
            if not call.announceable:
                return
            self._current_index = self._announced
            self._announced += 1
            deltas.append(ToolCallDelta(self._current_index, self._new_id(), call.name, ""))
        piece = call.arguments(self._scanner.text, self._arguments_sent)
        if piece:
            deltas.append(ToolCallDelta(self._current_index, None, None, piece))
            self._arguments_sent += len(piece)
