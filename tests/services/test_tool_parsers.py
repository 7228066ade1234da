"""Tool-call parsing of model output (services/gateway/tool_parsers): the whole-output parse of
each format, the streaming property (any split of an output streams to what `parse` returns),
the JSON scanner against `json.loads`, and the choice of parser."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from services.gateway.tool_parsers import (
    ContentDelta,
    HermesToolParser,
    IdFactory,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    new_call_id,
    parser_for,
    tool_finish_reason,
)
from services.gateway.tool_parsers.json_scan import JsonValueScanner, ScanStatus
from services.gateway.tool_parsers.scanner import skip_whitespace

ParserClass = type[ToolParser]


def counting_ids() -> IdFactory:
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def call(index: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{index:024x}", name=name, arguments=arguments)


def parse(parser_class: ParserClass, text: str) -> ParsedOutput:
    return parser_class(counting_ids()).parse(text)


def replay(parser_class: ParserClass, pieces: list[str]) -> tuple[str, list[ToolCall], bool]:
    """Stream `pieces`; return the concatenated content, the calls rebuilt from the deltas and
    whether the stream reports tool calls. Checks the delta order on the way."""
    stream = parser_class(counting_ids()).stream()
    deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.finish()
    content = ""
    calls: list[dict[str, str]] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            assert delta.text, "no empty content deltas"
            content += delta.text
        elif delta.id is not None:  # the first delta of a call: id and name, no arguments yet
            assert delta.index == len(calls) and delta.name and delta.arguments == ""
            calls.append({"id": delta.id, "name": delta.name, "arguments": ""})
        else:
            assert delta.index == len(calls) - 1 and delta.name is None and delta.arguments
            calls[delta.index]["arguments"] += delta.arguments
    return content, [ToolCall(**fields) for fields in calls], stream.has_tool_calls


def random_pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
    return [text[start:end] for start, end in itertools.pairwise([0, *cuts, len(text)])]


def splits(text: str, seed: int, count: int = 25) -> Iterator[list[str]]:
    rng = random.Random(seed)
    yield [text]
    yield list(text)
    for _ in range(count):
        yield random_pieces(text, rng)


# -- hermes -----------------------------------------------------------------------------------

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


def hermes_block(call_object: str) -> str:
    return f"<tool_call>\n{call_object}\n</tool_call>"


def test_hermes_single_call_has_no_content() -> None:
    parsed = parse(HermesToolParser, hermes_block(WEATHER))
    assert parsed == ParsedOutput(None, [call(0, "get_weather", '{"city": "Paris", "unit": "celsius"}')])
    assert parsed.has_tool_calls
    assert json.loads(parsed.tool_calls[0].arguments) == {"city": "Paris", "unit": "celsius"}


def test_hermes_parallel_calls_and_content_around_them() -> None:
    text = "Let me look.\n" + hermes_block(WEATHER) + "\n" + hermes_block('{"name": "now", "arguments": {}}') + "\nOK."
    parsed = parse(HermesToolParser, text)
    assert parsed.content == "Let me look.\n\n\nOK."
    assert parsed.tool_calls == [
        call(0, "get_weather", '{"city": "Paris", "unit": "celsius"}'),
        call(1, "now", "{}"),
    ]


def test_hermes_arguments_keep_the_models_whitespace() -> None:
    text = hermes_block('{"name": "f", "arguments": {"a":1,   "b": [1, 2],\n "c": {"d": null}}}')
    assert parse(HermesToolParser, text).tool_calls == [call(0, "f", '{"a":1,   "b": [1, 2],\n "c": {"d": null}}')]


@pytest.mark.parametrize(
    "call_object",
    [
        '{"name": "f", "arguments": "{\\"city\\": \\"Paris\\"}"}',  # arguments as a JSON string
        '{"name": "f", "parameters": {"city": "Paris"}}',
        '{"arguments": {"city": "Paris"}, "name": "f"}',  # name last
        '{"name": "f", "id": 7, "arguments": {"city": "Paris"}}',  # members we do not use
    ],
)
def test_hermes_accepted_call_shapes(call_object: str) -> None:
    assert parse(HermesToolParser, hermes_block(call_object)).tool_calls == [call(0, "f", '{"city": "Paris"}')]


def test_hermes_last_block_may_lack_its_closing_tag() -> None:
    parsed = parse(HermesToolParser, "<tool_call>\n" + WEATHER + "\n")
    assert parsed.content is None and [c.name for c in parsed.tool_calls] == ["get_weather"]


HERMES_MALFORMED_EARLY = [  # found malformed before the call could be announced
    hermes_block("not json at all"),
    hermes_block('{"name": 3, "arguments": {}}'),
    hermes_block('{"name": "", "arguments": {}}'),
    hermes_block('{"arguments": {"a": 1}}'),
    hermes_block('{"name": "f"}'),
    hermes_block('{"name": "f", "arguments": 5}'),
    hermes_block('{"name": "f", "arguments": "[1, 2]"}'),
    hermes_block('{"name": "f", "name": "g", "arguments": {}}'),
    hermes_block("[" + WEATHER + "]"),
    '<tool_call>\n{"name": "get_weather", "argu',  # cut off
    "<tool_call>",
    "<tool_call",
]
HERMES_MALFORMED_LATE = [  # malformed after the name and the first arguments were streamed
    hermes_block('{"name": "f", "arguments": {"a": }}'),
    hermes_block('{"name": "f", "arguments": {"a": 1}} trailing'),
    hermes_block('{"name": "f", "arguments": {"a": "line\nbreak"}}'),  # raw newline in a string
    hermes_block('{"name": "f", "arguments": {"a": 1}, "arguments": {}}'),
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # cut off
]


@pytest.mark.parametrize("text", HERMES_MALFORMED_EARLY + HERMES_MALFORMED_LATE)
def test_hermes_malformed_call_stays_content(text: str) -> None:
    assert parse(HermesToolParser, text) == ParsedOutput(text, [])


def test_hermes_malformed_block_between_good_ones_stays_content() -> None:
    bad = hermes_block('{"name": "f", "arguments": {"a": }}')
    text = hermes_block(WEATHER) + bad + hermes_block('{"name": "now", "arguments": {}}')
    parsed = parse(HermesToolParser, text)
    assert parsed.content == bad
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "now"]


@pytest.mark.parametrize("parser_class", [HermesToolParser, Llama3JsonToolParser, MistralToolParser])
@pytest.mark.parametrize("text", ["", "Hello there.", "  \n", "a < b and [c] {d}"])
def test_plain_text_is_all_content(parser_class: ParserClass, text: str) -> None:
    parsed = parse(parser_class, text)
    assert parsed == ParsedOutput(text, []) and not parsed.has_tool_calls


# -- llama3_json ------------------------------------------------------------------------------

LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize("prefix", ["", "  \n", "<|python_tag|>", "<|python_tag|> "])
def test_llama3_single_call(prefix: str) -> None:
    parsed = parse(Llama3JsonToolParser, prefix + LLAMA_CALL)
    assert parsed == ParsedOutput(None, [call(0, "get_weather", '{"city": "Paris"}')])


def test_llama3_calls_separated_by_semicolons() -> None:
    text = LLAMA_CALL + "; " + '{"name": "now", "arguments": {}}' + ";\n" + '{"name": "f", "parameters": {"x": [1]}}'
    assert parse(Llama3JsonToolParser, text).tool_calls == [
        call(0, "get_weather", '{"city": "Paris"}'),
        call(1, "now", "{}"),
        call(2, "f", '{"x": [1]}'),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "The weather: " + LLAMA_CALL,  # does not start with a call
        '{"name": "Bob", "age": 3}',  # JSON, but not a call
        '{"result": 5}',
        '{"name": "get_weather", "parameters": {"city": }}',
        "<|python_tag|>brave_search.call(query='paris')",
        '{"name": "get_weather", "parameters": {"city": "Par',  # cut off
    ],
)
def test_llama3_non_calls_are_content(text: str) -> None:
    assert parse(Llama3JsonToolParser, text) == ParsedOutput(text, [])


def test_llama3_text_after_the_calls_is_content() -> None:
    bad = '; {"name": "g", "parameters": oops}'
    parsed = parse(Llama3JsonToolParser, LLAMA_CALL + bad)
    assert parsed == ParsedOutput(bad, [call(0, "get_weather", '{"city": "Paris"}')])
    parsed = parse(Llama3JsonToolParser, LLAMA_CALL + "\nThat is all.")
    assert parsed == ParsedOutput("\nThat is all.", [call(0, "get_weather", '{"city": "Paris"}')])


# -- mistral ----------------------------------------------------------------------------------


def test_mistral_list_of_calls_after_content() -> None:
    calls = '{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}'
    text = "Checking. [TOOL_CALLS] [" + calls + "]"
    assert parse(MistralToolParser, text) == ParsedOutput(
        "Checking. ", [call(0, "get_weather", '{"city": "Paris"}'), call(1, "now", "{}")]
    )


def test_mistral_name_and_args_form() -> None:
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}'
    assert parse(MistralToolParser, text) == ParsedOutput(
        None, [call(0, "get_weather", '{"city": "Paris"}'), call(1, "now", "{}")]
    )


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS] [{"name": "f", "arguments": {"a": }}]',
        "[TOOL_CALLS] []",
        "[TOOL_CALLS] not a call",
        "[TOOL_CALLS][ARGS]{}",  # no name
        "[TOOL_CALLS]f[ARGS][1]",
        "[TOOL_CALLS]f[ARGS]{",
        "[TOOL_CALLS]",
        "[TOOL_CALL",
    ],
)
def test_mistral_malformed_calls_stay_content(text: str) -> None:
    assert parse(MistralToolParser, text) == ParsedOutput(text, [])


def test_mistral_bad_element_ends_the_list() -> None:
    text = '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": 1}] bye'
    assert parse(MistralToolParser, text) == ParsedOutput(', {"name": 1}] bye', [call(0, "a", "{}")])


# -- streaming --------------------------------------------------------------------------------

LATE_FAILURES = HERMES_MALFORMED_LATE + [
    '{"name": "get_weather", "parameters": {"city": }}',
    '{"name": "get_weather", "parameters": {"city": "Par',
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": }}]',
    "[TOOL_CALLS]f[ARGS]{",
]

HANDWRITTEN: list[tuple[ParserClass, str]] = [
    (HermesToolParser, hermes_block(WEATHER)),
    (HermesToolParser, "Let me look.\n" + hermes_block(WEATHER) + "\n\n" + hermes_block(WEATHER) + " <tool_"),
    (HermesToolParser, "\n\n" + hermes_block(WEATHER) + "\n"),
    (HermesToolParser, hermes_block('{"name": "f", "arguments": "{\\"a\\": \\"\\u00e9\\\\n\\"}"}')),
    (HermesToolParser, "<tool_call>\n" + WEATHER),
    (HermesToolParser, "a <tool_cal b <tool_call c </tool_call> <<tool_call>" + WEATHER + "</tool_call>"),
    *[(HermesToolParser, text) for text in HERMES_MALFORMED_EARLY + HERMES_MALFORMED_LATE],
    (Llama3JsonToolParser, LLAMA_CALL),
    (Llama3JsonToolParser, " <|python_tag|>" + LLAMA_CALL + " ;\n" + LLAMA_CALL + ";"),
    (Llama3JsonToolParser, LLAMA_CALL + "; oops"),
    (Llama3JsonToolParser, "<|python_ta"),
    (Llama3JsonToolParser, '{"name": "Bob", "age": 3}'),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": }}'),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": "Par'),
    (
        MistralToolParser,
        'Hi [TOOL_CALLS] [{"name": "a", "arguments": {"x": -1.5e3}}, {"name": "b", "arguments": {}}] ok',
    ),
    (MistralToolParser, '[TOOL_CALLS]get_weather[ARGS] {"city": "Paris"}\n[TOOL_CALLS]now[ARGS]{}'),
    (MistralToolParser, '[TOOL_CALLS] [{"name": "f", "arguments": {"a": }}]'),
    (MistralToolParser, "[TOOL_CALLS]f[ARGS]{"),
    (MistralToolParser, "[TOOL_CALLS]bad name[ARGS]{}"),
    (MistralToolParser, "[TOOL_CALLS] [] [TOOL_"),
]


def assert_streams_like_parse(parser_class: ParserClass, text: str, seed: int) -> None:
    whole = parse(parser_class, text)
    for pieces in splits(text, seed):
        content, calls, has_tool_calls = replay(parser_class, pieces)
        assert content == (whole.content or ""), pieces
        assert has_tool_calls == whole.has_tool_calls, pieces
        if text not in LATE_FAILURES:
            assert calls == whole.tool_calls, pieces


@pytest.mark.parametrize(("parser_class", "text"), HANDWRITTEN)
def test_stream_matches_parse_handwritten(parser_class: ParserClass, text: str) -> None:
    assert_streams_like_parse(parser_class, text, seed=len(text))


_TRICKY_STRINGS = ["Paris", 'say "hi"', "back\\slash", "line\nbreak", "é🙂", "<tool_call>", "[TOOL_CALLS]", "}]", ""]
_CONTENT_PIECES = ["Sure.", " ", "\n", "a < b", "<tool", "[TOOL", "[", "{", "}", "é🙂", "<b>bold</b>"]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(_TRICKY_STRINGS)
    if kind == 1:
        return rng.choice([0, -7, 12345678901234, 3.25, -1e-7, 2.5e300])
    if kind == 2:
        return rng.choice([True, False])
    if kind == 3:
        return None
    if kind == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return random_object(rng, depth + 1)


def random_object(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {
        rng.choice(["city", "q", "n", "é", "a b"]) + str(i): random_value(rng, depth) for i in range(rng.randrange(4))
    }


def random_json(rng: random.Random, value: Any) -> str:
    return json.dumps(
        value,
        indent=rng.choice([None, None, 2]),
        ensure_ascii=rng.random() < 0.5,
        separators=rng.choice([None, (",", ":"), (", ", ": ")]),
    )


def random_call(rng: random.Random) -> tuple[str, str, str]:
    """(call object text, name, expected arguments) in the {"name", "arguments"} shape."""
    name = rng.choice(["get_weather", "search", "run_code"])
    arguments = random_json(rng, random_object(rng))
    written = json.dumps(arguments) if rng.random() < 0.2 else arguments
    members = [f'"name": {json.dumps(name)}', f'"{rng.choice(["arguments", "parameters"])}": {written}']
    if rng.random() < 0.2:
        members.reverse()
    space = rng.choice(["", " ", "\n  "])
    return "{" + space + ("," + space).join(members) + space + "}", name, arguments


def random_content(rng: random.Random) -> str:
    choices = _CONTENT_PIECES if rng.random() < 0.7 else [" ", "\n"]  # blank content around calls is None
    return "".join(rng.choice(choices) for _ in range(rng.randrange(4)))


def random_output(parser_class: ParserClass, rng: random.Random) -> tuple[str, ParsedOutput]:
    """A well-formed output of the format and what parsing it must give."""
    calls = [random_call(rng) for _ in range(rng.randrange(4))]
    expected = [call(i, name, arguments) for i, (_, name, arguments) in enumerate(calls)]
    content_pieces = [random_content(rng) for _ in range(len(calls) + 1)]
    if parser_class is HermesToolParser:
        blocks = [f"<tool_call>{rng.choice(['', chr(10)])}{obj}\n</tool_call>" for obj, _, _ in calls]
        text = "".join(piece + block for piece, block in zip(content_pieces, blocks, strict=False)) + content_pieces[-1]
        content = "".join(content_pieces)
    elif parser_class is Llama3JsonToolParser:
        if not calls:
            return random_output(parser_class, rng)
        objects = rng.choice([";", "; ", " ;\n"]).join(obj for obj, _, _ in calls)
        lead, tail = rng.choice(["", " ", "\n"]), rng.choice(["", "\n", "\nDone."])
        text = lead + rng.choice(["", "<|python_tag|>"]) + objects + tail
        content = lead + tail
    elif rng.random() < 0.5:
        listed = "[" + ", ".join(obj for obj, _, _ in calls) + "]"
        text = content_pieces[0] + "[TOOL_CALLS]" + rng.choice(["", " "]) + listed + content_pieces[-1]
        content = content_pieces[0] + content_pieces[-1]
        if not calls:
            text, content = content_pieces[0], content_pieces[0]
    else:
        pieces = [f"[TOOL_CALLS]{name}[ARGS]{arguments}" for _, name, arguments in calls]
        text = content_pieces[0] + "".join(pieces) + content_pieces[-1]
        content = content_pieces[0] + content_pieces[-1]
    return text, ParsedOutput(None if expected and not content.strip() else content, expected)


@pytest.mark.parametrize("parser_class", [HermesToolParser, Llama3JsonToolParser, MistralToolParser])
def test_stream_matches_parse_on_random_outputs(parser_class: ParserClass) -> None:
    rng = random.Random(parser_class.name)
    for index in range(60):
        text, expected = random_output(parser_class, rng)
        assert parse(parser_class, text) == expected, text
        assert_streams_like_parse(parser_class, text, seed=index)


@pytest.mark.parametrize("parser_class", [HermesToolParser, Llama3JsonToolParser, MistralToolParser])
def test_damaged_outputs_never_raise_lose_text_or_disagree(parser_class: ParserClass) -> None:
    rng = random.Random("damaged " + parser_class.name)
    for index in range(150):
        text = mutate(random_output(parser_class, rng)[0], rng)
        whole = parse(parser_class, text)
        if not whole.tool_calls:
            assert whole.content == text
        for pieces in itertools.islice(splits(text, index), 6):
            content, calls, has_tool_calls = replay(parser_class, pieces)
            assert content == (whole.content or "") and has_tool_calls == whole.has_tool_calls, pieces
            # the stream may hold extra calls that broke after they were announced, nothing else
            streamed = iter([(c.name, c.arguments) for c in calls])
            assert all((c.name, c.arguments) in streamed for c in whole.tool_calls), pieces


def test_stream_holds_back_only_what_could_start_a_marker() -> None:
    stream = HermesToolParser(counting_ids()).stream()
    assert stream.feed("Hi <tool_") == [ContentDelta("Hi ")]
    assert stream.feed("x") == [ContentDelta("<tool_x")]
    assert stream.feed(" <") == [ContentDelta(" ")]
    assert stream.finish() == [ContentDelta("<")]


def test_stream_announces_a_call_and_sends_arguments_before_it_ends() -> None:
    stream = HermesToolParser(counting_ids()).stream()
    assert stream.feed('<tool_call>\n{"name": "get_weather", "arguments": ') == []
    header, piece = stream.feed('{"city": "Pa')
    assert isinstance(header, ToolCallDelta) and isinstance(piece, ToolCallDelta)
    assert header == ToolCallDelta(0, "call_" + "0" * 24, "get_weather", "")
    assert header.to_openai() == {
        "index": 0,
        "id": "call_" + "0" * 24,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert piece.to_openai() == {"index": 0, "function": {"arguments": '{"city": "Pa'}}
    assert stream.feed('ris"}}\n</tool_call>') == [ToolCallDelta(0, None, None, 'ris"}')]
    assert stream.finish() == [] and stream.has_tool_calls


def test_stream_call_broken_after_its_announcement_arrives_as_content() -> None:
    text = hermes_block('{"name": "f", "arguments": {"a": }}')
    stream = HermesToolParser(counting_ids()).stream()
    deltas = stream.feed(text[:-20]) + stream.feed(text[-20:]) + stream.finish()
    assert deltas[0] == ToolCallDelta(0, "call_" + "0" * 24, "f", "")
    assert "".join(d.text for d in deltas if isinstance(d, ContentDelta)) == text
    assert not stream.has_tool_calls


def test_default_ids_and_finish_reason() -> None:
    call_id = new_call_id()
    assert call_id.startswith("call_") and len(call_id) == 29 and int(call_id[5:], 16) >= 0
    ids = [c.id for c in HermesToolParser().parse(hermes_block(WEATHER) + hermes_block(WEATHER)).tool_calls]
    assert len(set(ids)) == 2
    assert tool_finish_reason("stop", True) == "tool_calls"
    assert tool_finish_reason("stop", False) == "stop"
    assert tool_finish_reason("length", True) == "length"


# -- the JSON scanner -------------------------------------------------------------------------

_MUTATION_CHARS = '{}[]",:0123456789.eE+-tfnul\\ \n\x01aé'


def scanner_verdict(pieces: list[str]) -> tuple[bool, int]:
    """Whether the whole text is one JSON value (whitespace around it allowed), and where the
    scanner stopped."""
    scanner, text, pos = JsonValueScanner(), "", 0
    for piece in pieces:
        text += piece
        if scanner.status is ScanStatus.SCANNING:
            pos = skip_whitespace(text, pos) if pos == 0 else pos
            pos = scanner.advance(text, pos)
    scanner.close(text)
    return scanner.status is ScanStatus.DONE and skip_whitespace(text, scanner.end) == len(text), scanner.end


def json_loads_accepts(text: str) -> bool:
    def reject(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=reject)
    except ValueError:
        return False
    return True


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randrange(3)):
        at = rng.randrange(len(text) + 1)
        kind = rng.randrange(3)
        if kind == 0:
            text = text[:at] + text[at + 1 :]
        else:
            text = text[:at] + rng.choice(_MUTATION_CHARS) + text[at + (kind == 2) :]
    return text


def test_json_scanner_agrees_with_json_loads_on_any_split() -> None:
    rng = random.Random(7)
    extra = ["12", " -0.5e+3 ", "01", "1.", "-", "tru", "nul", "NaN", '"\\u12g4"', '"\\x"', "[1,]", "{,}", '{"a" 1}']
    for index in range(1500):
        text = extra[index] if index < len(extra) else mutate(random_json(rng, random_value(rng)), rng)
        accepted, end = scanner_verdict([text])
        assert accepted == json_loads_accepts(text), text
        assert scanner_verdict(random_pieces(text, rng)) == (accepted, end), text


# -- choosing a parser ------------------------------------------------------------------------

QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- tool | tojson }}"
    "{%- endfor %}{{- '</tools>\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags' }}{%- endif %}"
)
LLAMA31_TEMPLATE = (
    "{%- if builtin_tools is defined %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{%- if tool_call.name in builtin_tools %}{{- '<|python_tag|>' + tool_call.name + '.call(' }}{%- endif %}"
)
LLAMA32_TEMPLATE = (
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}{{- 'Respond in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}.\' }}'
    "{{- '{\"name\": \"' + tool_call.name + '\", \"parameters\": ' + tool_call.arguments | tojson + '}' }}"
)
MISTRAL_TEMPLATE = (
    "{%- elif message.tool_calls is defined %}{{- '[TOOL_CALLS] [' }}{%- for tool_call in message.tool_calls %}"
    "{{- '{\"name\": \"' + tool_call.function.name + '\", \"arguments\": ' + arguments + '}' }}{%- endfor %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content }}{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN_TEMPLATE, HermesToolParser),
        (LLAMA31_TEMPLATE, Llama3JsonToolParser),
        (LLAMA32_TEMPLATE, Llama3JsonToolParser),
        (MISTRAL_TEMPLATE, MistralToolParser),
        (CHATML_TEMPLATE, None),
        (None, None),
    ],
)
def test_parser_detected_from_chat_template(template: str | None, expected: ParserClass | None) -> None:
    assert parser_for(None, template) is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("hermes", HermesToolParser), ("llama3_json", Llama3JsonToolParser), ("mistral", MistralToolParser)],
)
def test_parser_named_explicitly_wins_over_the_template(name: str, expected: ParserClass) -> None:
    assert parser_for(name, QWEN_TEMPLATE) is expected
    assert parser_for(name, None) is expected


def test_unknown_parser_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown tool parser 'qwen'; known: hermes, llama3_json, mistral"):
        parser_for("qwen", QWEN_TEMPLATE)
