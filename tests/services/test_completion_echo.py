"""`echo` with `logprobs` on /v1/completions through the official OpenAI SDK and the in-process
gateway over the real engine: the prompt's tokens lead the logprobs (the first unscored),
whole and streamed alike; `max_tokens: 0` echoes and scores without generating; the chat
route is unaffected."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest

from tests.services.conftest import MODEL

pytestmark = pytest.mark.timeout(600)

PROMPT = "The capital of France is Paris, and the capital of Italy is"
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prompt_ids(engine_core: Any) -> list[int]:
    return list(engine_core.tokenizer.encode(PROMPT, add_special_tokens=False))


def check_logprobs(logprobs: Any, text: str, num_prompt: int, num_generated: int, top_n: int) -> None:
    """The OpenAI legacy shape after an echo: prompt tokens first (the first unscored), every
    top list holding N alternatives and the token itself, offsets counting through `text`."""
    tokens, values, tops = logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs
    offsets = logprobs.text_offset
    assert len(tokens) == len(values) == len(tops) == len(offsets) == num_prompt + num_generated
    assert values[0] is None and tops[0] is None and offsets[0] == 0
    assert all(isinstance(v, float) and v <= 0 for v in values[1:])
    for token, value, top in zip(tokens[1:], values[1:], tops[1:], strict=True):
        assert top[token] == value and top_n <= len(top) <= top_n + 1
    assert all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], tokens, strict=False))
    assert "".join(tokens) == text


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(client: openai.OpenAI, prompt_ids: list[int]) -> None:
    response = client.completions.create(prompt=PROMPT, echo=True, logprobs=2, max_tokens=3, **GREEDY)
    choice = response.choices[0]
    assert response.usage is not None and response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == 3
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    check_logprobs(choice.logprobs, choice.text, len(prompt_ids), 3, 2)
    plain = client.completions.create(prompt=PROMPT, logprobs=2, max_tokens=3, **GREEDY).choices[0]
    assert choice.text == PROMPT + plain.text
    assert plain.logprobs is not None and choice.logprobs is not None
    generated = (choice.logprobs.token_logprobs or [])[len(prompt_ids) :]
    same = zip(generated, plain.logprobs.token_logprobs or [], strict=True)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in same)
    assert (plain.logprobs.text_offset or [])[0] == 0


def test_streamed_echo_carries_the_same_logprobs(client: openai.OpenAI, prompt_ids: list[int]) -> None:
    whole = client.completions.create(prompt=PROMPT, echo=True, logprobs=2, max_tokens=4, **GREEDY).choices[0]
    chunks = list(client.completions.create(prompt=PROMPT, echo=True, logprobs=2, max_tokens=4, stream=True, **GREEDY))
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert pieces[0].text.startswith(PROMPT)  # the echo leads the first piece, with its logprobs
    assert pieces[0].logprobs is not None and len(pieces[0].logprobs.tokens or []) > len(prompt_ids)
    assert "".join(p.text for p in pieces) == whole.text
    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []}
    for piece in pieces:
        if piece.logprobs is not None:
            for key, values in streamed.items():
                values.extend(getattr(piece.logprobs, key))
    assert whole.logprobs is not None
    assert streamed["tokens"] == whole.logprobs.tokens and streamed["text_offset"] == whole.logprobs.text_offset
    assert streamed["token_logprobs"][0] is None and streamed["top_logprobs"][0] is None
    for a, b in zip(streamed["token_logprobs"][1:], (whole.logprobs.token_logprobs or [])[1:], strict=True):
        assert math.isclose(a, b, abs_tol=1e-4)
    assert pieces[-1].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_echo_without_generation_scores_the_prompt(client: openai.OpenAI, prompt_ids: list[int], stream: bool) -> None:
    kwargs: dict[str, Any] = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0, **GREEDY}
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        pieces = [c.choices[0] for c in chunks if c.choices]
        text = "".join(p.text for p in pieces)
        logprobs = next(p.logprobs for p in pieces if p.logprobs is not None)
        finish_reason, usage = pieces[-1].finish_reason, chunks[-1].usage
    else:
        response = client.completions.create(**kwargs)
        text, logprobs = response.choices[0].text, response.choices[0].logprobs
        finish_reason, usage = response.choices[0].finish_reason, response.usage
    assert text == PROMPT and finish_reason == "length"
    assert usage is not None and usage.completion_tokens == 0 and usage.prompt_tokens == len(prompt_ids)
    check_logprobs(logprobs, text, len(prompt_ids), 0, 1)
    scored = client.completions.create(prompt=PROMPT, echo=True, logprobs=1, max_tokens=2, **GREEDY).choices[0]
    assert scored.logprobs is not None
    same = zip(logprobs.token_logprobs[1:], (scored.logprobs.token_logprobs or [])[1 : len(prompt_ids)], strict=True)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in same)


def test_echo_of_several_prompts_and_choices(client: openai.OpenAI, engine_core: Any) -> None:
    prompts = ["One, two, three,", "Red, green,"]
    response = client.completions.create(prompt=prompts, echo=True, logprobs=0, max_tokens=2, n=2, **GREEDY)
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    for choice in response.choices:
        prompt = prompts[choice.index // 2]
        assert choice.text.startswith(prompt)
        check_logprobs(
            choice.logprobs, choice.text, len(engine_core.tokenizer.encode(prompt, add_special_tokens=False)), 2, 0
        )


def test_echo_without_logprobs_and_generation_is_the_prompt(client: openai.OpenAI) -> None:
    response = client.completions.create(prompt=[504, 3575, 282], echo=True, max_tokens=0, **GREEDY)
    assert response.choices[0].logprobs is None and response.usage is not None
    assert response.usage.completion_tokens == 0 and response.choices[0].finish_reason == "length"
    assert response.choices[0].text and response.usage.prompt_tokens == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 0, "logprobs": 2}, "max_tokens"),
        ({"echo": True, "max_tokens": -1}, "max_tokens"),
        ({"echo": True, "logprobs": 2, "prompt_logprobs": 2}, "prompt_logprobs"),
    ],
)
def test_refusals_name_the_field(client: openai.OpenAI, body: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, extra_body=body)  # type: ignore[arg-type]
    assert info.value.body["param"] == param  # type: ignore[index]


def test_chat_is_unaffected(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None and response.usage is not None
    assert len(choice.logprobs.content) == response.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    assert "prompt_logprobs" not in response.model_dump()
