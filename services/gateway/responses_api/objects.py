"""The objects of a Responses API answer: the response (its output items, usage and the
request's settings echoed), a `message` item and a `function_call` item."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from services.gateway.responses import Usage
from services.gateway.responses_api.protocol import ResponsesRequest


def new_object_id(prefix: str) -> str:
    """An id in OpenAI's style: `resp_`, `msg_` or `fc_` and 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message; `text` None while it has no content part yet (streams)."""
    content = [] if text is None else [output_text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


@dataclass(frozen=True)
class ResponseShape:
    """What a response says besides its output: its id, time and model, and the request's
    settings as OpenAI echoes them (defaults filled in)."""

    response_id: str
    model: str
    request: ResponsesRequest
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:
        """The response object; status `in_progress`, `completed` or `incomplete` (the output
        reached max_output_tokens, or the context length)."""
        req = self.request
        tool_choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
        if not isinstance(tool_choice, str):
            tool_choice = tool_choice.model_dump()
        text_format = req.text.format if req.text is not None else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": {
                "format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format else {"type": "text"}
            },
            "tool_choice": tool_choice,
            "tools": [tool.model_dump() for tool in req.tools or []],
            "top_p": req.top_p if req.top_p is not None else 1.0,
            "truncation": "disabled",
            "usage": usage_body(usage) if usage is not None else None,
            "user": req.user,
            "metadata": req.metadata or {},
        }
