"""From a validated request body to engine jobs: prompt token ids and SamplingParams per
choice, with the context-length check (OpenAI's 400 context_length_exceeded) and the
request's token budget (admission.py). Runs in a preparation thread (preparation.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine.sampling_params import SamplingParams
from engine.structured import GrammarSpec
from services.gateway.admission import TokenBudget, prompt_count
from services.gateway.errors import ContextLengthExceeded, InvalidRequest, field_error
from services.gateway.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields
from services.gateway.tool_choice import template_message, template_tools


@dataclass(frozen=True)
class Job:
    index: int  # choice index in the response (prompt_index * n + sample)
    prompt_index: int
    prompt_token_ids: list[int]
    params: SamplingParams


def resolve_max_tokens(
    requested: int | None, prompt_len: int, max_model_len: int, param: str, *, zero_with_echo: bool = False
) -> int:
    """The request's max_tokens, or what the context leaves; 0 only for a completion that
    echoes its prompt (`zero_with_echo`: OpenAI's echo without generation)."""
    if requested is not None and requested < (0 if zero_with_echo else 1):
        only = " (0 only with echo)" if param == "max_tokens" and requested == 0 else ""
        raise InvalidRequest(
            f"{param}: must be an integer >= 1{only}, got {requested}", param=param, code="invalid_value"
        )
    if prompt_len >= max_model_len or (requested is not None and prompt_len + requested > max_model_len):
        raise ContextLengthExceeded(max_model_len, prompt_len, requested)
    return requested if requested is not None else max_model_len - prompt_len


def sampling_params(
    req: _SamplingFields,
    *,
    max_tokens: int,
    logprobs: int | None,
    sample: int,
    logprobs_param: str,
    grammar: GrammarSpec | None = None,
    vocab_size: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    kwargs: dict[str, Any] = {"grammar": grammar, "logit_bias": logit_bias(req.logit_bias)}
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
    ):
        value = getattr(req, name)
        if value is not None:
            kwargs[name] = value
    if req.stop is not None:
        kwargs["stop"] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    if req.stop_token_ids is not None:
        kwargs["stop_token_ids"] = tuple(req.stop_token_ids)
    if req.seed is not None:
        kwargs["seed"] = req.seed + sample  # distinct, reproducible samples for n > 1
    try:
        params = SamplingParams(max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs, **kwargs)
        if vocab_size is not None:
            params.check_vocab(vocab_size)
        return params
    except ValueError as exc:
        message = str(exc)
        if message.startswith("logprobs:") and logprobs_param != "logprobs":
            message = logprobs_param + message[len("logprobs") :]
        raise field_error(message) from None
    except TypeError as exc:  # a value of a type SamplingParams cannot compare
        raise InvalidRequest(f"invalid sampling parameter: {exc}", code="invalid_value") from None


def logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's `logit_bias` has token ids as JSON object keys (strings)."""
    if not raw:
        return None
    biases: dict[int, float] = {}
    for key, value in raw.items():
        if not key.isdigit():
            raise InvalidRequest(
                f"logit_bias: keys must be token ids (non-negative integers), got {key!r}",
                param="logit_bias",
                code="invalid_value",
            )
        biases[int(key)] = value
    return biases


def chat_prompt(
    req: ChatCompletionRequest, tokenizer: Any, *, add_generation_prompt: bool = True, add_special_tokens: bool = False
) -> list[int]:
    """The prompt token ids of a conversation, rendered with its tools by the chat template."""
    messages = [template_message(m) for m in req.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tools=template_tools(req)
        )
    except ValueError as exc:
        raise InvalidRequest(f"messages: {exc}", param="messages", code="invalid_value") from None
    except Exception as exc:  # template errors (jinja raise_exception and the like) are the caller's input
        raise InvalidRequest(
            f"messages: the chat template rejected the conversation: {exc}",
            param="messages",
            code="invalid_value",
        ) from None
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def chat_jobs(
    req: ChatCompletionRequest,
    tokenizer: Any,
    max_model_len: int,
    grammar: GrammarSpec | None = None,
    budget: TokenBudget | None = None,
) -> list[Job]:
    budget = budget or TokenBudget.unlimited()
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget.check_completions(req.n, requested, max_model_len, param)
    prompt = chat_prompt(req, tokenizer)
    max_tokens = resolve_max_tokens(requested, len(prompt), max_model_len, param)
    budget.take(len(prompt), max_tokens, req.n, "messages")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return [
        Job(
            i,
            0,
            prompt,
            sampling_params(
                req,
                max_tokens=max_tokens,
                logprobs=logprobs,
                sample=i,
                logprobs_param="top_logprobs",
                grammar=grammar,
                vocab_size=tokenizer_vocab_size(tokenizer),
            ),
        )
        for i in range(req.n)
    ]


def completion_prompts(req: CompletionRequest, tokenizer: Any, vocab_size: int | None) -> Iterator[list[int]]:
    """The prompts' token ids, tokenised one at a time as the caller asks for the next."""
    raw: Any = req.prompt  # str | list[str] | list[int] | list[list[int]], validated by the model
    if isinstance(raw, str):
        texts_or_ids: list[Any] = [raw]
    elif raw and isinstance(raw[0], int):
        texts_or_ids = [raw]
    else:
        texts_or_ids = list(raw)
    single = len(texts_or_ids) == 1
    for i, item in enumerate(texts_or_ids):
        ids = list(tokenizer.encode(item, add_special_tokens=False)) if isinstance(item, str) else list(item)
        where = "prompt" if single else f"prompt[{i}]"
        if not ids:
            raise InvalidRequest(f"{where}: must not be empty", param="prompt", code="invalid_value")
        bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise InvalidRequest(
                f"{where}: token id {bad[0]} is out of range [0, {vocab_size})",
                param="prompt",
                code="invalid_value",
            )
        yield ids


def echo_prompt_logprobs(req: CompletionRequest) -> int | None:
    """What the engine scores of an echoed prompt: `logprobs` alternatives per token. An echo
    without generation (max_tokens 0) is a scoring request even when no logprobs are shown."""
    if not req.echo:
        return None
    if req.logprobs is not None:
        return req.logprobs
    return 0 if req.max_tokens == 0 else None


def completion_jobs(
    req: CompletionRequest,
    tokenizer: Any,
    max_model_len: int,
    vocab_size: int | None,
    grammar: GrammarSpec | None = None,
    budget: TokenBudget | None = None,
) -> tuple[list[Job], list[list[int]]]:
    """Each prompt is checked (context length, the request's token budget) as soon as it is
    tokenised, so a refused request stops tokenising at its first prompt past a limit."""
    budget = budget or TokenBudget.unlimited()
    budget.check_completions(prompt_count(req.prompt) * req.n, req.max_tokens, max_model_len, "max_tokens")
    prompt_logprobs = echo_prompt_logprobs(req)
    jobs: list[Job] = []
    prompts: list[list[int]] = []
    for p, prompt in enumerate(completion_prompts(req, tokenizer, vocab_size)):
        max_tokens = resolve_max_tokens(
            req.max_tokens, len(prompt), max_model_len, "max_tokens", zero_with_echo=bool(req.echo)
        )
        budget.take(len(prompt), max_tokens, req.n, "prompt")
        prompts.append(prompt)
        for i in range(req.n):
            jobs.append(
                Job(
                    p * req.n + i,
                    p,
                    prompt,
                    sampling_params(
                        req,
                        max_tokens=max_tokens,
                        logprobs=req.logprobs,
                        sample=i,
                        logprobs_param="logprobs",
                        grammar=grammar,
                        vocab_size=vocab_size,
                        prompt_logprobs=prompt_logprobs,
                    ),
                )
            )
    return jobs, prompts


def tokenizer_vocab_size(tokenizer: Any) -> int | None:
    for attr in ("vocab_size", "n_vocab"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    try:
        return len(tokenizer)
    except TypeError:
        return None
