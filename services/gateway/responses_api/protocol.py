"""The request body of `POST /v1/responses` (OpenAI's Responses API), validated as strictly as
the chat body (a wrong type is a 400 naming the field) and with its own field names.

What this server serves of it: `input` as a string or as message, `function_call` and
`function_call_output` items; function tools; `text.format`; the sampling fields. Item,
content-part, tool and format kinds it does not serve (images, files, built-in tools,
reasoning items) are a 400 `unsupported_parameter` naming the field, and so is asking for
stored state (`store: true`, `previous_response_id`, `conversation`, `background: true`): this
server keeps no responses. Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError

from services.gateway.errors import InvalidRequest
from services.gateway.protocol import _Body, validation_error

ITEM_KINDS = ("message", "function_call", "function_call_output")
PART_KINDS = ("input_text", "output_text")
FORMAT_KINDS = ("text", "json_object", "json_schema")


class TextPart(_Body):
    type: Literal["input_text", "output_text"]
    text: str


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return _joined(self.content)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    arguments: str  # JSON text, as the call was made


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[TextPart]

    def text(self) -> str:
        return _joined(self.output)


def _item_tag(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return {"function_call": "FunctionCall", "function_call_output": "FunctionCallOutput"}.get(kind, "Message")


# Tags are capitalised so that validation_error leaves them out of the field path.
InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
    Discriminator(_item_tag),
]


class FunctionTool(_Body):
    type: Literal["function"]
    name: str  # the pattern is checked where the chat request is (protocol.FunctionDefinition)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # json_schema only, as are the fields below
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None


class ResponsesRequest(_Body):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_output_tokens: int | None = None
    stream: bool | None = False
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None


def parse_responses(body: dict[str, Any]) -> ResponsesRequest:
    if body.get("input") == []:
        raise InvalidRequest("input: must not be empty", param="input", code="invalid_value")
    _check_kinds(body)
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    stored = [
        name
        for name, asked in (
            ("store", request.store is True),
            ("previous_response_id", request.previous_response_id is not None),
            ("conversation", request.conversation is not None),
            ("background", request.background is True),
        )
        if asked
    ]
    if stored:
        raise InvalidRequest(
            f"{stored[0]}: this server keeps no responses; send the whole conversation as input (store: false)",
            param=stored[0],
            code="unsupported_parameter",
        )
    return request


def _check_kinds(body: dict[str, Any]) -> None:
    """Kinds of item, content part, tool and format that OpenAI defines but this server does not
    serve: a 400 saying so (pydantic would only say which kinds it expected)."""
    for i, tool in _entries(body.get("tools")):
        _check_kind(tool.get("type"), ("function",), f"tools[{i}].type", "tool")
    for i, item in _entries(body.get("input")):
        kind = item.get("type", "message")
        _check_kind(kind, ITEM_KINDS, f"input[{i}].type", "input item")
        if kind == "message":
            for j, part in _entries(item.get("content")):
                _check_kind(part.get("type"), PART_KINDS, f"input[{i}].content[{j}].type", "content part")
        if kind == "function_call_output":
            for j, part in _entries(item.get("output")):
                _check_kind(part.get("type"), PART_KINDS, f"input[{i}].output[{j}].type", "content part")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        _check_kind(choice.get("type"), ("function",), "tool_choice.type", "tool choice")
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        _check_kind(text["format"].get("type"), FORMAT_KINDS, "text.format.type", "text format")


def _entries(value: Any) -> list[tuple[int, dict[str, Any]]]:
    return [(i, entry) for i, entry in enumerate(value) if isinstance(entry, dict)] if isinstance(value, list) else []


def _check_kind(kind: Any, served: tuple[str, ...], param: str, what: str) -> None:
    if isinstance(kind, str) and kind not in served:
        raise InvalidRequest(
            f"{param}: {what} type {kind!r} is not supported by this server (supported: {', '.join(served)})",
            param=param,
            code="unsupported_parameter",
        )
