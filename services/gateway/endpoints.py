"""The two generation endpoints as parameters of the one path that serves them (app.py): how
a body is parsed, the prefix of the response id, and how a parsed request becomes engine jobs
and a response formatter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engine.structured import GrammarSpec
from services.gateway.admission import TokenBudget, prompt_count
from services.gateway.chat_tool_calls import ChoiceToolCalls
from services.gateway.errors import InvalidRequest
from services.gateway.preprocess import Job, chat_jobs, completion_jobs, tokenizer_vocab_size
from services.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    _SamplingFields,
    parse_chat,
    parse_completion,
)
from services.gateway.responses import ChatFormatter, CompletionFormatter, EchoedPrompt, Formatter, TokenText
from services.gateway.structured_output import chat_grammar, guided_grammar
from services.gateway.tool_choice import renders_tools
from services.gateway.tool_parsers import ToolParser, parser_for

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
    tool_call_parser: str | None = None  # --tool-call-parser; None: from the chat template
    budget: TokenBudget = field(default_factory=TokenBudget.unlimited)  # the tokens it may ask for


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]
    num_prompts: int
    formatter: Formatter
    grammar: GrammarSpec | None = None  # what every choice's output must follow
    grammar_param: str = ""  # the field it came from, named if it cannot be compiled


def _one_prompt(body: dict[str, Any]) -> int:
    return 1


@dataclass(frozen=True)
class Endpoint(Generic[Req]):
    id_prefix: str
    parse: Callable[[dict[str, Any]], Req]
    plan: Callable[[Req, Served], Plan]
    count_prompts: Callable[[dict[str, Any]], int] = _one_prompt  # of a raw body, before parsing


def _tool_parser(req: ChatCompletionRequest, served: Served) -> type[ToolParser] | None:
    """The parser of the model's tool-call syntax when the request's tools are in play."""
    if not renders_tools(req):
        return None
    try:
        parser = parser_for(served.tool_call_parser, getattr(served.tokenizer, "chat_template", None))
    except ValueError as exc:  # the configured name was checked at start; kept for embedders
        raise InvalidRequest(f"tools: {exc}", param="tools", code="unsupported_parameter") from None
    if parser is None:
        raise InvalidRequest(
            "tools: this model's chat template writes no tool-call syntax the server knows; "
            "start the gateway with --tool-call-parser",
            param="tools",
            code="unsupported_parameter",
        )
    return parser


def _chat_plan(req: ChatCompletionRequest, served: Served) -> Plan:
    parser = _tool_parser(req, served)
    grammar, grammar_param = chat_grammar(req, parser)
    jobs = chat_jobs(req, served.tokenizer, served.max_model_len, grammar, served.budget)
    formatter = ChatFormatter(
        served.response_id,
        served.model,
        served.token_text,
        logprobs=bool(req.logprobs),
        include_usage=served.include_usage,
        tool_calls=ChoiceToolCalls(parser()) if parser is not None else None,
    )
    return Plan(jobs, 1, formatter, grammar, grammar_param)


def _completion_plan(req: CompletionRequest, served: Served) -> Plan:
    tokenizer = served.tokenizer
    grammar, grammar_param = guided_grammar(req)
    vocab_size = tokenizer_vocab_size(tokenizer)
    jobs, prompts = completion_jobs(req, tokenizer, served.max_model_len, vocab_size, grammar, served.budget)
    echo = (
        [EchoedPrompt(tuple(p), tokenizer.decode(p, skip_special_tokens=False)) for p in prompts] if req.echo else None
    )
    formatter = CompletionFormatter(
        served.response_id,
        served.model,
        served.token_text,
        logprobs=req.logprobs is not None,
        include_usage=served.include_usage,
        echo=echo,
        n=req.n,
    )
    return Plan(jobs, len(prompts), formatter, grammar, grammar_param)


CHAT = Endpoint("chatcmpl", parse_chat, _chat_plan)
COMPLETION = Endpoint("cmpl", parse_completion, _completion_plan, lambda body: prompt_count(body.get("prompt")))
