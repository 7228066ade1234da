"""A Responses request as the chat completion request it is served as (docs/design.md §6.7).

Input items become chat messages (`instructions` a system message first; `function_call`
items an assistant message's `tool_calls`; `function_call_output` items `tool` messages),
tools become chat tools, `text.format` becomes `response_format`, `max_output_tokens`
becomes `max_completion_tokens`. The result goes through `parse_chat`, so every check of the
chat path applies; `responses_fields` renames the fields of its refusals back to the
Responses body's.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from services.gateway.errors import InvalidRequest
from services.gateway.protocol import ChatCompletionRequest, parse_chat
from services.gateway.responses_api.protocol import (
    FunctionCallItem,
    MessageItem,
    ResponsesRequest,
    TextFormat,
)

_SAME_FIELDS = ("model", "temperature", "top_p", "seed", "user", "parallel_tool_calls")

# chat field path -> Responses field path; the first full match wins
_FIELD_NAMES = (
    (re.compile(r"messages(\[\d+\])?(\..+)?"), "input"),
    (re.compile(r"tools\[(\d+)\]\.function\.(.+)"), r"tools[\1].\2"),
    (re.compile(r"tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"response_format\.json_schema\.(.+)"), r"text.format.\1"),
    (re.compile(r"response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"max_(completion_)?tokens"), "max_output_tokens"),
)


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    body: dict[str, Any] = {"messages": chat_messages(req)}
    for name in _SAME_FIELDS:
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools is not None:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in req.tools
        ]
    if isinstance(req.tool_choice, str):
        body["tool_choice"] = req.tool_choice
    elif req.tool_choice is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    text_format = req.text.format if req.text is not None else None
    if text_format is not None:
        body["response_format"] = _response_format(text_format)
    return parse_chat(body)


def chat_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    names: dict[str, str] = {}  # call_id -> function name, for the tool message of its result
    for item in req.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of one assistant turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            tool: dict[str, Any] = {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
            if item.call_id in names:
                tool["name"] = names[item.call_id]
            messages.append(tool)
    return messages


def _response_format(text_format: TextFormat) -> dict[str, Any]:
    if text_format.type != "json_schema":
        return {"type": text_format.type}
    if text_format.name is None:
        raise InvalidRequest(
            "text.format.name: required when type is json_schema",
            param="text.format.name",
            code="missing_required_parameter",
        )
    json_schema: dict[str, Any] = {"name": text_format.name}
    for name, value in (
        ("description", text_format.description),
        ("schema", text_format.schema_),
        ("strict", text_format.strict),
    ):
        if value is not None:
            json_schema[name] = value
    return {"type": "json_schema", "json_schema": json_schema}


def responses_param(param: str) -> str:
    """The Responses body's name for a field of the chat request it was translated to."""
    for pattern, name in _FIELD_NAMES:
        match = pattern.fullmatch(param)
        if match is not None:
            return match.expand(name)
    return param


@contextlib.contextmanager
def responses_fields() -> Iterator[None]:
    """Refusals raised by the chat path, with the Responses body's field names."""
    try:
        yield
    except InvalidRequest as exc:
        if exc.param is None or responses_param(exc.param) == exc.param:
            raise
        param = responses_param(exc.param)
        message = param + exc.message[len(exc.param) :] if exc.message.startswith(exc.param) else exc.message
        raise InvalidRequest(message, param=param, code=exc.code, headers=exc.headers) from None
