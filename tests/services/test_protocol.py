"""Request validation and error shapes, without a server: every bad body is a 400 naming
its field, in the OpenAI error shape."""

from __future__ import annotations

import json

import pytest

from services.gateway.errors import (
    APIError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    ServiceUnavailable,
    field_error,
)
from services.gateway.preprocess import resolve_max_tokens, sampling_params
from services.gateway.protocol import parse_chat, parse_completion
from services.gateway.sse import DONE, sse_comment, sse_event

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**changes: object) -> dict[str, object]:
    return {**CHAT, **changes}


def assert_openai_shape(error: APIError, status: int) -> None:
    assert error.status == status
    body = error.body()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 5.5}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"n": 0}, "n"),
        ({"n": 10**6}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stop": 5}, "stop"),
        ({"seed": True}, "seed"),
        ({"model": None}, "model"),
        ({"logprobs": 3}, "logprobs"),
        ({"stream_options": {"include_usage": "yes"}, "stream": True}, "stream_options.include_usage"),
    ],
)
def test_bad_chat_fields_name_the_field(changes: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(chat(**changes))
    assert_openai_shape(info.value, 400)
    assert info.value.param == param, info.value.message


def test_missing_model_is_missing_required_parameter() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"messages": CHAT["messages"]})
    assert info.value.code == "missing_required_parameter" and info.value.param == "model"


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.function"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice.function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                    }
                ]
            },
            "messages[0].tool_calls",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_invalid_or_unsupported_fields_are_refused_naming_them(changes: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(chat(**changes))
    assert info.value.param == param


def test_unknown_fields_are_ignored_and_extensions_parsed() -> None:
    req = parse_chat(
        chat(
            foo=1,
            parallel_tool_calls=True,
            top_k=5,
            min_p=0.1,
            ignore_eos=True,
            max_completion_tokens=7,
            developer_note="x",
        )
    )
    assert req.top_k == 5 and req.min_p == 0.1 and req.ignore_eos and req.max_completion_tokens == 7


def test_content_parts_and_developer_role() -> None:
    req = parse_chat(
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
            ]
        )
    )
    assert [m.text() for m in req.messages] == ["be brief", "a\nb", ""]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": [[]]}, "prompt[0]"),
        ({"model": "m", "prompt": [1, "a"]}, "prompt[1]"),
        ({"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "m", "prompt": "x", "best_of": 3}, "best_of"),
        ({"model": "m", "prompt": "x", "logprobs": 6}, "logprobs"),
        ({"model": "m", "prompt": "x", "echo": 1}, "echo"),
        ({"model": "m", "prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs"),
    ],
)
def test_bad_completion_fields(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_completion(body)
    assert info.value.param is not None and info.value.param.startswith(param.split("[")[0])


def test_completion_prompt_forms() -> None:
    assert parse_completion({"model": "m", "prompt": "x"}).prompt == "x"
    assert parse_completion({"model": "m", "prompt": ["a", "b"]}).prompt == ["a", "b"]
    assert parse_completion({"model": "m", "prompt": [1, 2]}).prompt == [1, 2]
    assert parse_completion({"model": "m", "prompt": [[1], [2, 3]]}).prompt == [[1], [2, 3]]


def test_sampling_params_errors_name_the_field() -> None:
    req = parse_chat(chat(temperature=1e300, top_p=0.5))
    with pytest.raises(InvalidRequest) as info:
        sampling_params(req, max_tokens=4, logprobs=None, sample=0, logprobs_param="top_logprobs")
    assert info.value.param == "temperature"
    req = parse_chat(chat(logprobs=True, top_logprobs=50))
    with pytest.raises(InvalidRequest) as info:
        sampling_params(req, max_tokens=4, logprobs=50, sample=0, logprobs_param="top_logprobs")
    assert info.value.param == "top_logprobs"


def test_seed_varies_per_choice() -> None:
    req = parse_chat(chat(seed=7, n=3))
    seeds = [sampling_params(req, max_tokens=4, logprobs=None, sample=i, logprobs_param="x").seed for i in range(3)]
    assert seeds == [7, 8, 9]


def test_context_length() -> None:
    assert resolve_max_tokens(None, 10, 100, "max_tokens") == 90
    assert resolve_max_tokens(90, 10, 100, "max_tokens") == 90
    for requested, prompt_len in ((91, 10), (None, 100), (1, 100)):
        with pytest.raises(ContextLengthExceeded) as info:
            resolve_max_tokens(requested, prompt_len, 100, "max_tokens")
        assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest) as bad:
        resolve_max_tokens(0, 10, 100, "max_completion_tokens")
    assert bad.value.param == "max_completion_tokens"
    assert resolve_max_tokens(0, 10, 100, "max_tokens", zero_with_echo=True) == 0  # OpenAI's echo only
    with pytest.raises(InvalidRequest, match="0 only with echo"):
        resolve_max_tokens(0, 10, 100, "max_tokens")


def test_error_statuses_and_shapes() -> None:
    assert_openai_shape(ModelNotFound("x"), 404)
    assert_openai_shape(Overloaded("busy", 2), 429)
    assert Overloaded("busy", 2).headers["Retry-After"] == "2"
    assert_openai_shape(ServiceUnavailable("none"), 503)
    assert field_error("top_k: must be an integer").param == "top_k"
    assert field_error("something went wrong").param is None


def test_sse_framing() -> None:
    event = sse_event({"text": "a\nb", "emoji": "é"})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:]) == {"text": "a\nb", "emoji": "é"}
    assert DONE == b"data: [DONE]\n\n"
    assert sse_comment("keep\nalive") == b": keep alive\n\n"
