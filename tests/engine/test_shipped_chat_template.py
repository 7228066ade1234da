"""The chat template shipped for the embedded SmolLM2 (engine/assets/chat_templates/): the
same text as the GGUF file's own template for conversations without tools, and tool calls
written so that the gateway's parser for the template reads them back."""

from __future__ import annotations

import pytest

from engine.loader.resolve import resolve_model, shipped_chat_template
from engine.loader.tokenizer import Tokenizer, _compile

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me more, with ünïcode ✓."},
    ],
    [{"role": "user", "content": "a"}, {"role": "system", "content": "a system turn in the middle"}],
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_source(resolve_model("smollm2-135m"))


@pytest.fixture(scope="module")
def file_template() -> str:
    source = resolve_model("smollm2-135m")
    own = Tokenizer.from_gguf(source.path).chat_template
    assert own is not None
    return own


def test_the_alias_and_a_copy_of_its_file_get_the_shipped_template(tokenizer):
    shipped = shipped_chat_template("smollm2-135m")
    assert shipped is not None and tokenizer.chat_template == shipped
    assert shipped_chat_template(str(resolve_model("smollm2-135m").path)) == shipped
    assert shipped_chat_template("some-other-model") is None


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_without_tools_it_renders_what_the_file_template_renders(
    tokenizer, file_template, conversation, add_generation_prompt
):
    expected = _compile(file_template).render(messages=conversation, add_generation_prompt=add_generation_prompt)
    assert tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt) == expected


def test_tools_calls_and_results_are_rendered(tokenizer):
    conversation = [
        {"role": "user", "content": "Weather in Paris and Lima?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "22 C"},
    ]
    text = tokenizer.apply_chat_template(conversation, tools=[WEATHER])
    assert '<tools>\n{"name": "get_weather", "description": "Current weather in a city"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n22 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_parser_the_template_selects_reads_its_calls_back(tokenizer):
    from services.gateway.tool_parsers import parser_for

    parser = parser_for(None, tokenizer.chat_template)
    assert parser is not None and parser.name == "hermes"
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2]}}}],
            },
        ],
        add_generation_prompt=False,
        tools=[WEATHER],
    )
    assistant_turn = rendered.split("<|im_start|>assistant\n")[1].removesuffix("<|im_end|>\n")
    parsed = parser().parse(assistant_turn)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("f", '{"a": [1, 2]}')]
    assert parsed.content is None
