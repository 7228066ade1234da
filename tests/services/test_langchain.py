"""LangChain's `ChatOpenAI` against the real app over the real engine on the embedded model (the
in-process gateway of conftest.py): tool calls through `bind_tools`, a tool loop with a
`ToolMessage`, `with_structured_output` by each of its three methods, and a streamed call.

The 135M model calls a tool only when forced (`tool_choice` "required" or a named function),
which constrains its output to calls matching each tool's schema; every schema here is bounded
(strings with maxLength, integers with a range) so that the constrained output ends.
"""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
import pydantic
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.services.conftest import MODEL

pytestmark = pytest.mark.timeout(600)


class GetWeather(pydantic.BaseModel):
    """Current weather in a city."""

    city: str = pydantic.Field(max_length=20, description="The city, e.g. Paris")
    unit: Literal["celsius", "fahrenheit"]


class SearchWeb(pydantic.BaseModel):
    """Search the web."""

    query: str = pydantic.Field(max_length=40)


class City(pydantic.BaseModel):
    """A city and the country it is in."""

    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population_millions: int = pydantic.Field(ge=0, le=1000)


TOOLS = [GetWeather, SearchWeb]
SCHEMAS = {tool.__name__: convert_to_openai_tool(tool)["function"]["parameters"] for tool in [*TOOLS, City]}
ASK: list[BaseMessage] = [HumanMessage("What is the weather like in Paris today?")]


@pytest.fixture(scope="module")
def llm(url: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{url}/v1",
        api_key=SecretStr("x"),
        model=MODEL,
        temperature=0,
        max_completion_tokens=80,  # ChatOpenAI's max_tokens, by the name it sends
        max_retries=0,
        timeout=120,
    )


def _valid_calls(message: AIMessage) -> list[ToolCall]:
    """The message's tool calls, each checked against its tool's parameter schema."""
    assert not message.invalid_tool_calls
    for call in message.tool_calls:
        assert call["id"] and call["id"].startswith("call_")
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])
    return list(message.tool_calls)


def test_bind_tools_required_gives_a_valid_call(llm: ChatOpenAI) -> None:
    message = llm.bind_tools(TOOLS, tool_choice="required", parallel_tool_calls=False).invoke(ASK)
    assert isinstance(message, AIMessage)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert len(_valid_calls(message)) == 1


def test_bind_tools_named_calls_that_tool(llm: ChatOpenAI) -> None:
    message = llm.bind_tools(TOOLS, tool_choice="SearchWeb").invoke([HumanMessage("Find me umbrella shops.")])
    calls = _valid_calls(message)
    assert [call["name"] for call in calls] == ["SearchWeb"]


def test_a_two_turn_loop_with_a_tool_message(llm: ChatOpenAI) -> None:
    first = llm.bind_tools(TOOLS, tool_choice="required", parallel_tool_calls=False).invoke(ASK)
    assert isinstance(first, AIMessage)
    (call,) = _valid_calls(first)
    history: list[BaseMessage] = [*ASK, first, ToolMessage("18 degrees celsius, sunny", tool_call_id=call["id"])]
    final = llm.bind_tools(TOOLS).invoke(history, max_completion_tokens=24)
    assert isinstance(final, AIMessage)
    assert final.content or final.tool_calls
    assert first.usage_metadata and final.usage_metadata
    # the call and its result were rendered into the second prompt
    assert final.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"] + 20


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_with_structured_output_returns_the_model(
    llm: ChatOpenAI, method: Literal["json_schema", "function_calling", "json_mode"]
) -> None:
    # json_mode constrains the output to a JSON object only: the prompt asks for the keys
    ask = (
        "Describe Paris as a JSON object with the keys name (a string), country (a string) "
        "and population_millions (an integer)."
    )
    structured = llm.with_structured_output(City, method=method, include_raw=True)
    result: Any = structured.invoke([HumanMessage(ask)])
    assert result["parsing_error"] is None, result["raw"]
    assert isinstance(result["parsed"], City)
    raw = result["raw"]
    if method == "function_calling":  # LangChain named the function in tool_choice
        assert [call["name"] for call in _valid_calls(raw)] == ["City"]
    else:
        assert not raw.tool_calls and raw.response_metadata["finish_reason"] == "stop"


def test_a_streamed_tool_call_accumulates_to_the_call(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools(TOOLS, tool_choice="GetWeather")
    chunks: list[AIMessageChunk] = []
    for chunk in bound.stream(ASK):
        assert isinstance(chunk, AIMessageChunk)
        chunks.append(chunk)
    pieces = [piece for chunk in chunks for piece in chunk.tool_call_chunks]
    assert pieces[0]["name"] == "GetWeather" and pieces[0]["id"]
    assert len([piece for piece in pieces if piece["args"]]) >= 2  # the arguments arrive in pieces
    total = add_ai_message_chunks(chunks[0], *chunks[1:])
    (call,) = _valid_calls(total)
    assert total.response_metadata["finish_reason"] == "tool_calls"
    whole = bound.invoke(ASK)
    assert isinstance(whole, AIMessage)
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [(call["name"], call["args"])]
