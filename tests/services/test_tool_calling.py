"""Tool calling and structured output through the official `openai` SDK against the real app
over the real engine on the embedded model (the in-process gateway of conftest.py).

The 135M model rarely calls a tool on its own, so the calls here are forced (`required` or a
named function), which constrains its output to calls that match each function's schema.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.services.conftest import MODEL

pytestmark = pytest.mark.timeout(600)

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "maxLength": 40}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _valid_calls(calls: Any) -> list[tuple[str, dict[str, Any]]]:
    parsed = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        parsed.append((call.function.name, arguments))
    return parsed


def test_required_tool_call_whole(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert len(_valid_calls(choice.message.tool_calls)) == 1


def test_named_tool_call_streamed_name_first_then_arguments(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    pieces: list[Any] = []
    finish_reason = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content
        pieces.extend(delta.tool_calls or [])
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    assert finish_reason == "tool_calls"
    assert pieces[0].id and pieces[0].function.name == "get_weather"
    assert all(p.index == 0 for p in pieces) and all(p.id is None for p in pieces[1:])
    arguments = "".join(p.function.arguments or "" for p in pieces)
    assert len([p for p in pieces if p.function.arguments]) >= 2  # arguments arrive in pieces
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)

    whole = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    assert whole.choices[0].message.tool_calls[0].function.arguments == arguments


def test_a_two_turn_tool_loop(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    calls = first.choices[0].message.tool_calls
    assert calls
    messages: list[Any] = [*ASK, first.choices[0].message.model_dump(exclude_none=True)]
    for call in calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius, sunny"})
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=40, temperature=0)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    # the earlier call and its result were in the prompt: it is longer than the first turn's
    assert final.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_required_with_parallel_calls_gives_only_valid_calls(client: openai.OpenAI) -> None:
    """The tiny model goes on calling until max_tokens; every complete call is valid."""
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris and in Lima, and search for umbrellas."}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=120,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("tool_calls", "length")
    assert len(_valid_calls(choice.message.tool_calls)) >= 1


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population_millions: int = pydantic.Field(ge=0, le=1000)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Paris."}],
        response_format=City,
        max_tokens=80,
        temperature=0,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)


def test_json_object_output_parses(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Reply with a JSON object with the keys name and age of a person."}],
        response_format={"type": "json_object"},
        max_tokens=60,
        temperature=0,
    )
    assert response.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(response.choices[0].message.content or ""), dict)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
        ({"guided_regex": r"[0-9]{3}-[0-9]{4}"}, lambda text: len(text) == 8 and text[3] == "-"),
        (
            {"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
            lambda text: isinstance(json.loads(text)["ok"], bool),
        ),
    ],
    ids=["choice", "regex", "json"],
)
def test_vllm_guided_fields(client: openai.OpenAI, extra: dict[str, Any], check: Any) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, temperature=0.7, seed=1, extra_body=extra
    )
    assert check(chat.choices[0].message.content)
    completion = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=40, extra_body=extra)
    assert check(completion.choices[0].text)


def test_logit_bias_forces_a_token(client: openai.OpenAI, engine_core: Any) -> None:
    token = engine_core.tokenizer.encode(" banana", add_special_tokens=False)[0]
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=3, temperature=0, logit_bias={str(token): 100}
    )
    assert response.choices[0].message.content == " banana" * 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_regex": "\U00040000"}, "guided_regex"),  # a character no token can spell
        ({"guided_grammar": "root ::= "}, "guided_grammar"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "response_format"),
        ({"guided_choice": ["a"], "ignore_eos": True}, "ignore_eos"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_structured_fields_are_a_400_naming_them(url: str, body: dict[str, Any], param: str) -> None:
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert httpx.get(f"{url}/ready", timeout=10).status_code == 200


def test_tool_choice_none_renders_no_tools(client: openai.OpenAI) -> None:
    without = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=1)
    assert none.usage.prompt_tokens == without.usage.prompt_tokens < auto.usage.prompt_tokens
