"""Tool calling at the request boundary: the checks OpenAI makes on `tools`, `tool_choice` and
the conversation's tool messages (each a 400 naming the field), and what the chat template
receives: the tool definitions, and assistant `tool_calls` with their arguments as objects.

`tool_choice` decides (docs/design.md §6.6) whether the tools are rendered into the prompt
and the output parsed for calls (`auto`, the default when tools are given; `required` and a
named function, which also constrain the output to calls), or neither (`none`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import jsonschema

from services.gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from services.gateway.protocol import ChatCompletionRequest, ChatMessage


def check_tools(request: ChatCompletionRequest) -> None:
    tools = request.tools or []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        function = tool.function
        if function.name in names:
            raise InvalidRequest(
                f"tools[{i}].function.name: {function.name!r} is defined twice",
                param=f"tools[{i}].function.name",
                code="invalid_value",
            )
        names.add(function.name)
        if function.parameters is not None:
            _check_schema(function.parameters, f"tools[{i}].function.parameters")
    choice = request.tool_choice
    if choice not in (None, "none", "auto") and not tools:
        raise InvalidRequest(
            "tool_choice: only allowed when tools are given", param="tool_choice", code="invalid_value"
        )
    if not isinstance(choice, str) and choice is not None and choice.function.name not in names:
        raise InvalidRequest(
            f"tool_choice: the function {choice.function.name!r} is not among tools ({', '.join(sorted(names))})",
            param="tool_choice.function.name",
            code="invalid_value",
        )
    for i, message in enumerate(request.messages):
        _check_message(i, message)


def _check_schema(schema: dict[str, Any], param: str) -> None:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise InvalidRequest(
            f"{param}: not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}",
            param=param,
            code="invalid_value",
        ) from None
    if schema.get("type", "object") != "object":
        raise InvalidRequest(f"{param}: must describe an object (type: object)", param=param, code="invalid_value")


def _check_message(i: int, message: ChatMessage) -> None:
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidRequest(
                f"messages[{i}].tool_call_id: required for a tool message",
                param=f"messages[{i}].tool_call_id",
                code="missing_required_parameter",
            )
        if message.content is None:
            raise InvalidRequest(
                f"messages[{i}].content: required for a tool message",
                param=f"messages[{i}].content",
                code="missing_required_parameter",
            )
    if message.tool_calls and message.role != "assistant":
        raise InvalidRequest(
            f"messages[{i}].tool_calls: only assistant messages carry tool calls",
            param=f"messages[{i}].tool_calls",
            code="invalid_value",
        )


def renders_tools(request: ChatCompletionRequest) -> bool:
    """Whether the tools go into the prompt and the output is parsed for calls."""
    return bool(request.tools) and request.tool_choice != "none"


def template_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    if not renders_tools(request):
        return None
    return [tool.model_dump(exclude_none=True) for tool in request.tools or []]


def template_message(message: ChatMessage) -> dict[str, Any]:
    """One message as chat templates expect it: `developer` is `system`, text parts are joined,
    and tool-call arguments are objects where they parse as JSON objects (templates dump them
    with `tojson`)."""
    rendered: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": message.text() if message.content is not None or not message.tool_calls else None,
    }
    if message.name is not None:
        rendered["name"] = message.name
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    return rendered


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text
