"""Request bodies of the OpenAI API (chat completions and legacy completions), validated
strictly: a wrong type is a 400 naming the field, never a coercion or a 5xx.

Unknown fields are ignored (clients send many); fields whose meaning we cannot honour are
refused with a 400 naming the field rather than silently ignored.
Extensions shared with other servers: top_k, min_p, repetition_penalty, min_tokens,
ignore_eos, stop_token_ids, skip_special_tokens, include_stop_str_in_output.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.gateway.errors import InvalidRequest
from services.gateway.tool_choice import check_tools

MAX_N = 16


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_.-]{1,64}$"


class FunctionDefinition(_Body):
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object; checked by tools.check_tools
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class JSONSchemaFormat(_Body):
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


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
    # vLLM's structured-output extensions (at most one; chat also takes response_format)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    guided_grammar: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_SamplingFields):
    # tried in this order, the first match wins: a long list of ids is validated once, not
    # also against list[str] with an error per element
    prompt: Annotated[
        str
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1)],
        Field(union_mode="left_to_right"),
    ]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None
    prompt_logprobs: int | None = None  # vLLM's; refused: echo with logprobs gives them


def _loc(loc: tuple[int | str, ...]) -> str:
    # drop pydantic's union-branch tags ("str", "list[int]", "function-after[...]", a model's
    # class name); the API's own field names are lower case
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in item or item[:1].isupper() or item in {"str", "int", "float", "bool", "list", "dict", "none"}:
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
    if request.functions:
        raise InvalidRequest(
            "functions: deprecated by OpenAI and not supported; send tools instead",
            param="functions",
            code="unsupported_parameter",
        )
    check_tools(request)
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
    if request.prompt_logprobs is not None:
        raise InvalidRequest(
            "prompt_logprobs: not supported; send echo: true with logprobs to get the prompt's logprobs",
            param="prompt_logprobs",
            code="unsupported_parameter",
        )
    if request.best_of is not None and request.best_of != request.n:
        raise InvalidRequest("best_of: only best_of == n is supported", param="best_of", code="unsupported_parameter")
    if request.logprobs is not None and not 0 <= request.logprobs <= 5:
        raise InvalidRequest(
            f"logprobs: must be in [0, 5], got {request.logprobs}", param="logprobs", code="invalid_value"
        )
    _check_common(request)
    return request


def _check_common(request: _SamplingFields) -> None:
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest(
            "stream_options: only allowed when stream is true", param="stream_options", code="invalid_value"
        )
