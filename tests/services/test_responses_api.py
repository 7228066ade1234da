"""`POST /v1/responses` (OpenAI's Responses API) through the official `openai` SDK and the
OpenAI Agents SDK, against the real app over the real engine on the embedded model (the
in-process gateway of conftest.py); and the stream's event shaping on its own.

The 135M model rarely calls a tool on its own, so first turns force the call (`required`
with `parallel_tool_calls: false`, or a named function): the output is then constrained to
one call whose arguments match the function's schema. Requests keep their outputs short.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

from services.gateway import GatewayConfig
from services.gateway.errors import InternalError
from services.gateway.responses import Usage
from services.gateway.responses_api.events import ResponsesWire
from services.gateway.responses_api.objects import ResponseShape
from services.gateway.responses_api.protocol import parse_responses
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

pytestmark = pytest.mark.timeout(600)

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER_PARAMETERS,
        "strict": True,
    }
]
ASK = "What is the weather like in Paris today?"
STORY = "Write a long story about the sea."


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_prompt_tokens(client: openai.OpenAI, messages: list[Any]) -> int:
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    assert chat.usage is not None
    return chat.usage.prompt_tokens


def test_text_input_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input=STORY, max_output_tokens=8, temperature=0)
    assert whole.id.startswith("resp_") and whole.object == "response" and whole.model == MODEL
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    [message] = whole.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert whole.output_text and whole.usage is not None and whole.usage.output_tokens == 8
    assert whole.usage.total_tokens == whole.usage.input_tokens + 8
    assert whole.usage.input_tokens == _chat_prompt_tokens(client, [{"role": "user", "content": STORY}])

    events = list(client.responses.create(model=MODEL, input=STORY, max_output_tokens=8, temperature=0, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) == len(kinds) - 8 >= 2
    assert [event.sequence_number for event in events] == list(range(len(events)))
    item_id = events[2].item.id  # type: ignore[union-attr]
    assert all(event.item_id == item_id and event.output_index == 0 for event in deltas)
    text = "".join(event.delta for event in deltas)
    assert text == events[-4].text == whole.output_text  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "incomplete" and final.output_text == text and final.output[0].id == item_id


def test_instructions_and_message_items_make_the_chat_conversation(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        instructions="You are terse.",
        input=[
            {"role": "developer", "content": "Answer in French."},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "there"}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Bonjour"}]},
            {"role": "user", "content": "How are you?"},
        ],
        max_output_tokens=2,
        temperature=0,
        metadata={"case": "instructions"},
        user="tester",
    )
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hi\nthere"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "How are you?"},
        ],
        max_tokens=2,
        temperature=0,
    )
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.output_text == chat.choices[0].message.content
    assert response.instructions == "You are terse." and response.max_output_tokens == 2
    assert response.metadata == {"case": "instructions"} and response.user == "tester"


def test_a_forced_call_then_its_result_gives_a_message(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0,
    )
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id is not None and call.id.startswith("fc_") and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    assert first.tool_choice == "required" and first.parallel_tool_calls is False
    assert first.tools[0].name == "get_weather"  # type: ignore[union-attr]

    result = "18 degrees celsius, sunny"
    second_input: list[Any] = [
        {"role": "user", "content": ASK},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": result},
    ]
    second = client.responses.create(model=MODEL, input=second_input, tools=TOOLS, max_output_tokens=30, temperature=0)
    assert second.output and second.output[0].type in ("message", "function_call")
    assert second.output_text or second.output[0].type == "function_call"
    assert first.usage is not None and second.usage is not None
    # the call and its result are in the prompt exactly as a chat conversation puts them there
    chat_call = {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    chat_messages: list[Any] = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result},
    ]
    chat_tools: list[Any] = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    chat = client.chat.completions.create(
        model=MODEL, messages=chat_messages, tools=chat_tools, max_tokens=1, temperature=0
    )
    assert chat.usage is not None and second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + 20


def test_a_named_call_streams_its_name_first_then_its_arguments(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            input=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"} and len(kinds) - 6 >= 2
    added = events[2].item  # type: ignore[union-attr]
    assert added.type == "function_call" and added.name == "get_weather" and added.arguments == ""
    arguments = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert arguments == events[-3].arguments  # type: ignore[union-attr]
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "completed" and final.usage is not None
    [call] = final.output
    assert call.id == added.id and call.call_id == added.call_id and call.arguments == arguments


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)


def test_a_json_schema_text_format_parses(client: openai.OpenAI) -> None:
    response = client.responses.parse(
        model=MODEL, input="Describe Paris.", text_format=City, max_output_tokens=40, temperature=0
    )
    assert isinstance(response.output_parsed, City)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


FORCED = {"tools": TOOLS, "tool_choice": "required"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": None}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "no spaces"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}]}, "tools[0].parameters"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}}, "text.format.schema"),
        ({**FORCED, "text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi " * 9000}, "input"),
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"metadata": {"n": 1}}, "metadata.n"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field(url: str, body: dict[str, Any], param: str) -> None:
    response = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "hi", **body}, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_unknown_fields_are_ignored_and_unknown_models_are_a_404(url: str) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 1, "store": False, "include": [], "truncation": "auto"}
    assert httpx.post(f"{url}/v1/responses", json={**body, "prompt_cache_key": "k"}, timeout=60).status_code == 200
    missing = httpx.post(f"{url}/v1/responses", json={**body, "model": "gpt-9"}, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_client_disconnect_aborts_the_stream(url: str, loop: EngineLoop) -> None:
    body = {"model": MODEL, "input": STORY, "max_output_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=60) as response:
        deltas = 0
        for line in response.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas >= 3:
                break
        assert loop.stats().engine.num_running == 1
    deadline = time.monotonic() + 10
    while loop.stats().engine.num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.stats().engine.num_running == 0
    metrics = httpx.get(f"{url}/metrics").text
    assert f'dspark_requests_total{{model="{MODEL}",role="gateway",status="499"}}' in metrics


# -- the Agents SDK's run loop ----------------------------------------------------------------


def _weather_agent(url: str, api: str, **agent_options: Any) -> tuple[Agent[Any], list[str]]:
    """An agent with one tool, forced to call it on its first turn. After a tool call the SDK
    resets tool_choice (`reset_tool_choice`, on by default), so the next turn may answer in
    text, and the run ends there."""
    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"It is 18 degrees celsius and sunny in {city}."

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = OpenAIResponsesModel(MODEL, client) if api == "responses" else OpenAIChatCompletionsModel(MODEL, client)
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=80),
        **agent_options,
    )
    return agent, called


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_agent_calls_its_tool_then_answers(url: str, api: str) -> None:
    agent, called = _weather_agent(url, api)
    result = asyncio.run(Runner.run(agent, ASK, max_turns=3))
    assert called == ["Paris"]
    assert [type(item) for item in result.new_items] == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert len(result.raw_responses) == 2


def test_an_agent_streams_from_responses_and_stops_on_its_tool(url: str) -> None:
    agent, called = _weather_agent(url, "responses", tool_use_behavior="stop_on_first_tool")

    async def run() -> tuple[Any, list[str]]:
        result = Runner.run_streamed(agent, ASK, max_turns=2)
        kinds = [event.data.type async for event in result.stream_events() if event.type == "raw_response_event"]
        return result.final_output, kinds

    final_output, kinds = asyncio.run(run())
    assert called == ["Paris"] and final_output == "It is 18 degrees celsius and sunny in Paris."
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds


# -- the stream's shaping, without an engine --------------------------------------------------


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def _events(data: bytes) -> list[dict[str, Any]]:
    events = []
    for block in data.decode().split("\n\n")[:-1]:
        event_line, data_line = block.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {payload['type']}"
        events.append(payload)
    return events


def _wire() -> ResponsesWire:
    request = parse_responses({"model": MODEL, "input": "hi", "tools": TOOLS})
    return ResponsesWire(ResponseShape("resp_1", MODEL, request))


def test_text_then_a_call_are_two_output_items_in_order() -> None:
    wire = _wire()
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    data = wire.opening() + wire.chunk(_chunk({"role": "assistant", "content": ""}))
    data += wire.chunk(_chunk({"content": "Let me check."}))
    data += wire.chunk(_chunk({"tool_calls": [call, {"index": 0, "function": {"arguments": '{"city": '}}]}))
    data += wire.chunk(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}, "tool_calls"))
    data += wire.closing(Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4))
    events = _events(data)
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.completed", None),
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    response = events[-1]["response"]
    message, function_call = response["output"]
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "completed"
    assert function_call["call_id"] == "call_1" and function_call["arguments"] == '{"city": "Paris"}'
    assert response["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }


def test_a_failure_mid_stream_is_one_error_event() -> None:
    wire = _wire()
    data = wire.opening() + wire.chunk(_chunk({"content": "Hel"}))
    data += wire.failure(InternalError("The request failed on a worker: boom", code="worker_error"))
    error = _events(data)[-1]
    assert error == {
        "type": "error",
        "sequence_number": 5,
        "code": "worker_error",
        "message": "The request failed on a worker: boom",
        "param": None,
    }


def test_a_whole_body_cut_short_is_incomplete() -> None:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Once upon"}, "finish_reason": "length"}]
    }
    response = _wire().whole(body, Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=0))
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert (
        response["output"][0]["status"] == "incomplete" and response["output"][0]["content"][0]["text"] == "Once upon"
    )


def test_keys_served_names_refusals_and_latency_metrics(loop: EngineLoop) -> None:
    with start_gateway(loop, GatewayConfig(api_keys=("k1",), served_model_names=("alias",))) as url:
        wait_ready(url, 60)
        body = {"model": "alias", "input": "hi", "max_output_tokens": 3, "stream": True}
        assert httpx.post(f"{url}/v1/responses", json=body, timeout=60).status_code == 401
        auth = {"Authorization": "Bearer k1"}
        assert httpx.post(f"{url}/v1/responses", json={**body, "store": True}, headers=auth).status_code == 400
        with httpx.stream("POST", f"{url}/v1/responses", json=body, headers=auth, timeout=60) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert lines[0] == "event: response.created"
        assert lines[-2] in ("event: response.completed", "event: response.incomplete")
        assert not any(line.startswith("data: [DONE]") for line in lines)
        assert json.loads(lines[-1].removeprefix("data: "))["response"]["model"] == "alias"
        metrics = httpx.get(f"{url}/metrics").text
        counted = 'dspark_requests_total{model="%s",role="gateway",status="%d"} 1.0'
        assert counted % ("unknown", 401) in metrics and counted % (MODEL, 400) in metrics
        assert counted % (MODEL, 200) in metrics
        labels = f'{{model="{MODEL}",role="gateway"}}'
        assert f"dspark_time_to_first_token_seconds_count{labels} 1.0" in metrics
        assert f"dspark_e2e_request_latency_seconds_count{labels} 1.0" in metrics
