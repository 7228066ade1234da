"""Request bodies of the OpenAI API (chat completions and legacy completions), validated
strictly: a wrong type is a 400 naming the field, never a coercion or a 5xx.

Unknown fields are ignored (clients send many); fields whose meaning we cannot honour
(tools, response formats, logit biases) are refused rather than silently ignored.
Extensions shared with other servers: top_k, min_p, repetition_penalty, min_tokens,
ignore_eos, stop_token_ids, skip_special_tokens, include_stop_str_in_output.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.gateway.errors import InvalidRequest

MAX_N = 16


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class _SamplingFields(_Body):
    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    user: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    logit_bias: dict[str, float] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


def _loc(loc: tuple[int | str, ...]) -> str:
    # drop pydantic's union-branch tags ("str", "list[int]", "function-after[...]")
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in item or item in {"str", "int", "float", "bool", "list", "dict", "none"}:
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def validation_error(exc: ValidationError) -> InvalidRequest:
    """A pydantic error as one OpenAI 400: the most specific problem, with its field path
    (for a union, the branch that got furthest into the value)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    if not errors:
        return InvalidRequest("invalid request body", code="invalid_value")
    first = max(errors, key=lambda e: len(_loc(tuple(e["loc"]))))
    param = _loc(tuple(first["loc"])) or None
    if first["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    message = f"{param}: {first['msg']}" if param else first["msg"]
    code = "invalid_type" if "type" in first["type"] else "invalid_value"
    return InvalidRequest(message, param=param, code=code)


def parse_chat(body: dict[str, Any]) -> ChatCompletionRequest:
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if request.tools or request.functions:
        raise InvalidRequest(
            "tools: tool calling is not supported by this server", param="tools", code="unsupported_parameter"
        )
    if request.tool_choice not in (None, "none", "auto"):
        raise InvalidRequest(
            "tool_choice: tool calling is not supported by this server",
            param="tool_choice",
            code="unsupported_parameter",
        )
    if request.response_format is not None and request.response_format.get("type", "text") != "text":
        raise InvalidRequest(
            'response_format: only {"type": "text"} is supported',
            param="response_format",
            code="unsupported_parameter",
        )
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequest("top_logprobs: requires logprobs to be true", param="top_logprobs", code="invalid_value")
    _check_common(request)
    return request


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    try:
        request = CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if request.suffix:
        raise InvalidRequest("suffix: not supported by this server", param="suffix", code="unsupported_parameter")
    if request.best_of is not None and request.best_of != request.n:
        raise InvalidRequest("best_of: only best_of == n is supported", param="best_of", code="unsupported_parameter")
    if request.logprobs is not None and not 0 <= request.logprobs <= 5:
        raise InvalidRequest(
            f"logprobs: must be in [0, 5], got {request.logprobs}", param="logprobs", code="invalid_value"
        )
    _check_common(request)
    return request


def _check_common(request: _SamplingFields) -> None:
    if request.logit_bias:
        raise InvalidRequest(
            "logit_bias: not supported by this server", param="logit_bias", code="unsupported_parameter"
        )
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest(
            "stream_options: only allowed when stream is true", param="stream_options", code="invalid_value"
        )
