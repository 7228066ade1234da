"""OpenAI response bodies: chat completions and legacy completions, whole and streamed."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.outputs import RequestOutput, TokenLogprob
from services.gateway.chat_tool_calls import ChoiceToolCalls

MIN_LOGPROB = -9999.0  # what OpenAI reports for impossible tokens; JSON has no -Infinity


def _lp(value: float) -> float:
    return value if math.isfinite(value) else MIN_LOGPROB


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # an echoed prompt's, when asked for
    finish_reason: str | None = None
    unsent_tokens: int = 0  # tokens whose text has not been streamed yet (partial UTF-8)

    def absorb(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.new_logprobs)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.unsent_tokens += len(out.new_token_ids)
        if out.finished:
            self.finish_reason = out.finish_reason


def openai_finish_reason(reason: str | None) -> str | None:
    if reason in ("stop", "length") or reason is None:
        return reason
    return "stop"


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


class TokenText:
    """Token id -> the text a client sees in logprobs (cached; decoding is per token)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) < 200_000:
                self._cache[token_id] = text
        return text


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    def one(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8", "replace"))}

    return {
        "content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries],
        "refusal": None,
    }


def completion_logprobs(
    entries: Sequence[TokenLogprob],
    token_text: TokenText,
    text_offset: int,
    *,
    echoed_prompt: Sequence[int] = (),
    prompt_entries: Sequence[TokenLogprob] = (),
) -> dict[str, Any]:
    """OpenAI's legacy logprobs: per token its text, logprob, top alternatives (with the token
    itself, so up to N + 1 of them) and text offset. An echoed prompt's tokens come first,
    from offset 0: the first one unscored (nulls), token i scored by `prompt_entries[i - 1]`;
    the generated `entries` start at `text_offset`."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []

    def add(token_id: int, entry: TokenLogprob | None, offset: int) -> int:
        text = token_text(token_id)
        tokens.append(text)
        offsets.append(offset)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
        else:
            token_logprobs.append(_lp(entry.logprob))
            top = {token_text(t): _lp(lp) for t, lp in entry.top}
            top.setdefault(text, _lp(entry.logprob))
            tops.append(top)
        return offset + len(text)

    offset = 0
    for i, token_id in enumerate(echoed_prompt):
        offset = add(token_id, prompt_entries[i - 1] if 0 < i <= len(prompt_entries) else None, offset)
    offset = text_offset
    for entry in entries:
        offset = add(entry.token_id, entry, offset)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


class _Formatter:
    """The response envelope both endpoints share: id, object, created, model, choices, usage.
    A choice is `{"index", <content fields>, "logprobs", "finish_reason"}`; the subclasses say
    what its content and logprobs are."""

    object_full: str
    object_chunk: str

    def __init__(
        self, response_id: str, model: str, token_text: TokenText, *, logprobs: bool, include_usage: bool
    ) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.token_text = token_text
        self.logprobs = logprobs
        self.include_usage = include_usage

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        body = self._envelope(self.object_chunk, choices)
        if self.include_usage:
            body["usage"] = usage.body() if usage else None
        return body

    @staticmethod
    def _choice(
        index: int, content: dict[str, Any], logprobs: dict[str, Any] | None, finish_reason: str | None
    ) -> dict[str, Any]:
        return {"index": index, **content, "logprobs": logprobs, "finish_reason": finish_reason}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self._chunk([], usage)

    def delta_chunk(self, index: int, out: RequestOutput, state: ChoiceState) -> dict[str, Any] | None:
        if not out.new_text and not (self.logprobs and out.new_logprobs) and not self._held(index):
            return None
        content, logprobs = self._delta(index, out)
        if content == {"delta": {}} and logprobs is None:  # a tool-call parser holds the text back
            return None
        return self._chunk([self._choice(index, content, logprobs, None)])

    def final_chunk(self, index: int, state: ChoiceState) -> dict[str, Any]:
        content, finish_reason = self._final_delta(index, openai_finish_reason(state.finish_reason))
        return self._chunk([self._choice(index, content, None, finish_reason)])

    def full(self, states: list[ChoiceState], usage: Usage) -> dict[str, Any]:
        choices = [self._choice(index, *self._whole(index, state)) for index, state in enumerate(states)]
        return {**self._envelope(self.object_full, choices), "usage": usage.body()}

    def _held(self, index: int) -> bool:
        """Whether the choice holds content back for its first streamed piece."""
        return False

    def _delta(self, index: int, out: RequestOutput) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The content fields and logprobs of a streamed piece of a choice."""
        raise NotImplementedError

    def _final_delta(self, index: int, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The content fields of a choice's last chunk, and its finish reason."""
        raise NotImplementedError

    def _whole(self, index: int, state: ChoiceState) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        """The content fields, logprobs and finish reason of a whole choice."""
        raise NotImplementedError


class ChatFormatter(_Formatter):
    """Chat choices; with `tool_calls`, their text is parsed into OpenAI tool calls."""

    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def __init__(
        self,
        response_id: str,
        model: str,
        token_text: TokenText,
        *,
        logprobs: bool,
        include_usage: bool,
        tool_calls: ChoiceToolCalls | None = None,
    ) -> None:
        super().__init__(response_id, model, token_text, logprobs=logprobs, include_usage=include_usage)
        self.tool_calls = tool_calls

    def opening_chunk(self, index: int) -> dict[str, Any]:
        return self._chunk([self._choice(index, {"delta": {"role": "assistant", "content": ""}}, None, None)])

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        return chat_logprobs(entries, self.token_text) if self.logprobs else None

    def _delta(self, index: int, out: RequestOutput) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if self.tool_calls is None:
            delta: dict[str, Any] = {"content": out.new_text}
        else:
            delta = self.tool_calls.feed(index, out.new_text)
        return {"delta": delta}, self._logprobs(list(out.new_logprobs))

    def _final_delta(self, index: int, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        if self.tool_calls is None:
            return {"delta": {}}, finish_reason
        held, finish_reason = self.tool_calls.finish(index, finish_reason)
        return {"delta": held}, finish_reason

    def _whole(self, index: int, state: ChoiceState) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        finish_reason = openai_finish_reason(state.finish_reason)
        if self.tool_calls is None:
            message: dict[str, Any] = {"role": "assistant", "content": state.text, "refusal": None}
        else:
            message, finish_reason = self.tool_calls.message(state.text, finish_reason)
        return {"message": message}, self._logprobs(state.logprobs), finish_reason


@dataclass(frozen=True)
class EchoedPrompt:
    """A completion prompt that `echo` puts before the generated text."""

    token_ids: tuple[int, ...]
    text: str


class CompletionFormatter(_Formatter):
    """Legacy completion choices. With `echo`, the prompt leads the text and, with `logprobs`,
    the logprobs: its first token unscored, the others as the engine scored them. Streamed,
    the echo goes out at once, or with `logprobs` in the choice's first piece, which carries
    the prompt's logprobs."""

    object_full = object_chunk = "text_completion"

    def __init__(
        self,
        response_id: str,
        model: str,
        token_text: TokenText,
        *,
        logprobs: bool,
        include_usage: bool,
        echo: list[EchoedPrompt] | None,
        n: int,
    ) -> None:
        super().__init__(response_id, model, token_text, logprobs=logprobs, include_usage=include_usage)
        self.echo = echo
        self.n = n
        self._offsets: dict[int, int] = {}  # streamed choice -> text offset of its next piece

    def _echoed(self, index: int) -> EchoedPrompt | None:
        return self.echo[index // self.n] if self.echo is not None else None

    def _logprobs(
        self,
        entries: Sequence[TokenLogprob],
        text_offset: int,
        echoed: EchoedPrompt | None,
        scored: Sequence[TokenLogprob],
    ) -> dict[str, Any] | None:
        """`entries` generated from `text_offset` on, after `echoed`'s prompt scored by `scored`."""
        if not self.logprobs:
            return None
        prompt = echoed.token_ids if echoed is not None else ()
        return completion_logprobs(entries, self.token_text, text_offset, echoed_prompt=prompt, prompt_entries=scored)

    def opening_chunk(self, index: int) -> dict[str, Any] | None:
        echoed = self._echoed(index)
        if echoed is None or self.logprobs:
            return None
        self._offsets[index] = len(echoed.text)
        return self._chunk([self._choice(index, {"text": echoed.text}, None, None)])

    def _held(self, index: int) -> bool:
        return self.echo is not None and index not in self._offsets

    def _delta(self, index: int, out: RequestOutput) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if index in self._offsets:
            offset = self._offsets[index]
            self._offsets[index] = offset + len(out.new_text)
            return {"text": out.new_text}, self._logprobs(out.new_logprobs, offset, None, ())
        echoed = self._echoed(index)  # the choice's first piece: the echo held for the logprobs
        prefix = echoed.text if echoed is not None else ""
        self._offsets[index] = len(prefix) + len(out.new_text)
        logprobs = self._logprobs(out.new_logprobs, len(prefix), echoed, out.prompt_logprobs or ())
        return {"text": prefix + out.new_text}, logprobs

    def _final_delta(self, index: int, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        return {"text": ""}, finish_reason

    def _whole(self, index: int, state: ChoiceState) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        echoed = self._echoed(index)
        prefix = echoed.text if echoed is not None else ""
        logprobs = self._logprobs(state.logprobs, len(prefix), echoed, state.prompt_logprobs)
        return {"text": prefix + state.text}, logprobs, openai_finish_reason(state.finish_reason)


Formatter = ChatFormatter | CompletionFormatter
