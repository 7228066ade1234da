"""OpenAI response bodies: chat completions and legacy completions, whole and streamed."""

from __future__ import annotations

import math
import time
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
    finish_reason: str | None = None
    unsent_tokens: int = 0  # tokens whose text has not been streamed yet (partial UTF-8)

    def absorb(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.new_logprobs)
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


def completion_logprobs(entries: list[TokenLogprob], token_text: TokenText, text_offset: int) -> dict[str, Any]:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for e in entries:
        text = token_text(e.token_id)
        tokens.append(text)
        token_logprobs.append(_lp(e.logprob))
        tops.append({token_text(t): _lp(lp) for t, lp in e.top} if e.top else None)
        offsets.append(offset)
        offset += len(text)
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
        if not out.new_text and not (self.logprobs and out.new_logprobs):
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


class CompletionFormatter(_Formatter):
    object_full = object_chunk = "text_completion"

    def __init__(
        self,
        response_id: str,
        model: str,
        token_text: TokenText,
        *,
        logprobs: bool,
        include_usage: bool,
        echo_texts: list[str] | None,
        n: int,
    ) -> None:
        super().__init__(response_id, model, token_text, logprobs=logprobs, include_usage=include_usage)
        self.echo_texts = echo_texts
        self.n = n
        self._offsets: dict[int, int] = {}

    def _echo(self, index: int) -> str:
        return self.echo_texts[index // self.n] if self.echo_texts is not None else ""

    def _logprobs(self, entries: list[TokenLogprob], text_offset: int) -> dict[str, Any] | None:
        return completion_logprobs(entries, self.token_text, text_offset) if self.logprobs else None

    def opening_chunk(self, index: int) -> dict[str, Any] | None:
        if self.echo_texts is None:
            return None
        text = self._echo(index)
        self._offsets[index] = len(text)
        return self._chunk([self._choice(index, {"text": text}, None, None)])

    def _delta(self, index: int, out: RequestOutput) -> tuple[dict[str, Any], dict[str, Any] | None]:
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + len(out.new_text)
        return {"text": out.new_text}, self._logprobs(list(out.new_logprobs), offset)

    def _final_delta(self, index: int, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        return {"text": ""}, finish_reason

    def _whole(self, index: int, state: ChoiceState) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        prefix = self._echo(index)
        logprobs = self._logprobs(state.logprobs, len(prefix))
        return {"text": prefix + state.text}, logprobs, openai_finish_reason(state.finish_reason)


Formatter = ChatFormatter | CompletionFormatter
