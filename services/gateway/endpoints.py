"""The two generation endpoints as parameters of the one path that serves them (app.py): how
a body is parsed, the prefix of the response id, and how a parsed request becomes engine jobs
and a response formatter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.gateway.preprocess import Job, chat_jobs, completion_jobs, tokenizer_vocab_size
from services.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    _SamplingFields,
    parse_chat,
    parse_completion,
)
from services.gateway.responses import ChatFormatter, CompletionFormatter, Formatter, TokenText

Req = TypeVar("Req", bound=_SamplingFields)


@dataclass(frozen=True)
class Served:
    """What the workers serve a request with, and how its response is labelled."""

    response_id: str
    model: str
    max_model_len: int
    tokenizer: Any
    token_text: TokenText
    include_usage: bool


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]
    num_prompts: int
    formatter: Formatter


@dataclass(frozen=True)
class Endpoint(Generic[Req]):
    id_prefix: str
    parse: Callable[[dict[str, Any]], Req]
    plan: Callable[[Req, Served], Plan]


def _chat_plan(req: ChatCompletionRequest, served: Served) -> Plan:
    jobs = chat_jobs(req, served.tokenizer, served.max_model_len)
    formatter = ChatFormatter(
        served.response_id,
        served.model,
        served.token_text,
        logprobs=bool(req.logprobs),
        include_usage=served.include_usage,
    )
    return Plan(jobs, 1, formatter)


def _completion_plan(req: CompletionRequest, served: Served) -> Plan:
    tokenizer = served.tokenizer
    jobs, prompts = completion_jobs(req, tokenizer, served.max_model_len, tokenizer_vocab_size(tokenizer))
    echo = [tokenizer.decode(p, skip_special_tokens=False) for p in prompts] if req.echo else None
    formatter = CompletionFormatter(
        served.response_id,
        served.model,
        served.token_text,
        logprobs=req.logprobs is not None,
        include_usage=served.include_usage,
        echo_texts=echo,
        n=req.n,
    )
    return Plan(jobs, len(prompts), formatter)


CHAT = Endpoint("chatcmpl", parse_chat, _chat_plan)
COMPLETION = Endpoint("cmpl", parse_completion, _completion_plan)
