"""The gateway app with the real engine colocated in-process (no Ray): protocol, streaming,
errors under fuzzing, authentication, overload, client disconnects."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import httpx
import openai
import pytest

from services.gateway import GatewayConfig
from services.gateway.pool import PoolConfig
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def wait_idle(loop: EngineLoop, timeout_s: float = 10.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        stats = loop.stats().engine
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_used_slots == 0:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"engine not idle after {timeout_s} s: {loop.stats().engine}")


def test_stream_and_whole_response_agree(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=messages("What is the capital of France?"), max_tokens=12, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages("What is the capital of France?"),
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed and streamed
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0  # type: ignore[union-attr]
    assert all(c.usage is None for c in chunks[:-1])


def test_sampling_options_logprobs_and_n(client: openai.OpenAI) -> None:
    sampling: dict[str, Any] = {
        "model": MODEL,
        "messages": messages("Name a colour."),
        "max_completion_tokens": 6,
        "temperature": 0.8,
        "top_p": 0.9,
        "seed": 11,
        "n": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.2,
        "stop": ["\n\n"],
        "extra_body": {"top_k": 20, "min_p": 0.05},
    }
    response = client.chat.completions.create(**sampling, logprobs=True, top_logprobs=3, user="u1")
    assert [c.index for c in response.choices] == [0, 1]
    for choice in response.choices:
        content = choice.logprobs.content  # type: ignore[union-attr]
        assert content and all(len(entry.top_logprobs) == 3 for entry in content)
        assert all(entry.logprob <= 0 for entry in content)
    again = client.chat.completions.create(**sampling)
    assert [c.message.content for c in again.choices] == [c.message.content for c in response.choices]


def test_completions(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2, echo=True
    )
    choice = response.choices[0]
    assert choice.text.startswith("The capital of France is") and len(choice.text) > 24
    usage = response.usage
    assert usage is not None and choice.logprobs is not None  # the echoed prompt's tokens lead the logprobs
    assert len(choice.logprobs.tokens or []) == usage.prompt_tokens + usage.completion_tokens
    batch = client.completions.create(model=MODEL, prompt=["One, two,", "A, B,"], max_tokens=3, temperature=0, n=2)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    streamed = list(client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=4, temperature=0, stream=True))
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")


def test_models_health_ready_metrics(url: str) -> None:
    models = httpx.get(f"{url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert httpx.get(f"{url}/v1/models/{MODEL}").json()["id"] == MODEL
    assert httpx.get(f"{url}/v1/models/nope").status_code == 404
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/ready").json()
    assert ready["status"] == "ready" and ready["workers"][0]["role"] == "worker"
    text = httpx.get(f"{url}/metrics").text
    assert 'dspark_time_to_first_token_seconds_count{model="smollm2-135m",role="gateway"}' in text
    assert 'dspark_kv_cache_usage_ratio{model="smollm2-135m",role="worker"}' in text


BAD_BODIES: list[tuple[bytes, int, str | None]] = [
    (b"", 400, None),
    (b"{", 400, None),
    (b"[1, 2]", 400, None),
    (b"\xff\xfe{}", 400, None),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\xc3\x28"}]}', 400, None),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\\udc00"}]}', 400, None),
    (
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        400,
        None,
    ),
    (
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
        400,
        None,
    ),
    (b'{"model": "smollm2-135m", "messages": []}', 400, "messages"),
    (
        b'{"model": "smollm2-135m", "messages": [{"role": "wizard", "content": "hi"}]}',
        400,
        "messages[0].role",
    ),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user"}], "max_tokens": -1}', 400, "max_tokens"),
    (
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], '
        b'"max_tokens": 99999999999999999999}',
        400,
        "messages",
    ),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "top_p": 0}', 400, "top_p"),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "top_k": -5}', 400, "top_k"),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "seed": 1e400}', 400, None),
    (
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "seed": 36893488147419103232}',
        400,
        "seed",
    ),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "n": -1}', 400, "n"),
    (
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "stop": ["", "a"]}',
        400,
        "stop",
    ),
    (b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (b'{"model": "smollm2-135m", "prompt": "x"}', 400, "messages"),
    (b"[" * 10000 + b"]" * 10000, 400, None),
    (b'{"a":' * 100 + b"1" + b"}" * 100, 400, None),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_BODIES)
def test_bad_bodies_get_openai_errors(url: str, body: bytes, status: int, param: str | None) -> None:
    response = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error


def test_context_too_long(url: str) -> None:
    body = {"model": MODEL, "messages": messages("word " * 9000), "max_tokens": 5}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    tokens = {"model": MODEL, "prompt": [10] * 8000, "max_tokens": 500}
    assert httpx.post(f"{url}/v1/completions", json=tokens).json()["error"]["code"] == "context_length_exceeded"
    out_of_vocab = {"model": MODEL, "prompt": [10**9], "max_tokens": 1}
    assert httpx.post(f"{url}/v1/completions", json=out_of_vocab).json()["error"]["param"] == "prompt"


def test_unknown_routes_and_methods(url: str) -> None:
    assert httpx.get(f"{url}/v1/nothing").json()["error"]["code"] == "not_found"
    response = httpx.get(f"{url}/v1/chat/completions")
    assert response.status_code == 405 and response.json()["error"]["type"] == "invalid_request_error"


GARBAGE: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**63,
    -(2**63) - 1,
    10**30,
    1e308,
    -1e308,
    0.5,
    -0.0,
    "",
    "x" * 5000,
    "\u0000",
    "🙂",
    [],
    [None],
    [1, "a"],
    {},
    {"a": {"b": []}},
    [[[]]],
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": ["a"]}],
    # structured output and tools: shapes that parse, schemas and patterns that cannot compile
    "required",
    "(unclosed",
    "root ::= ",
    ["a", ""],
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}},
    {"type": "function", "function": {"name": "f"}},
    [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}}}],
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}},
    {"50256": 100, "1": -100},
]
FIELDS = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "user",
    "stream_options",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "logit_bias",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
]


def test_schema_fuzzing_never_5xx_and_server_keeps_serving(url: str, loop: EngineLoop) -> None:
    rng = random.Random(1234)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(250):
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": messages("hi"),
                "max_tokens": 2,
                "stream": True,
            }
            for field in rng.sample(FIELDS, rng.randint(1, 3)):
                body[field] = rng.choice(GARBAGE)
            body["stream"] = True
            # 200s stream: read the status and hang up, which also exercises the abort path
            with http.stream("POST", "/v1/chat/completions", content=json.dumps(body)) as response:
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code != 200:
                    error = json.loads(response.read())["error"]
                    assert set(error) == {"message", "type", "param", "code"}, error
            assert response.status_code < 500, (body, response.status_code)
    assert statuses.get(400, 0) > 100 and set(statuses) <= {200, 400, 404}
    wait_idle(loop, 30)
    ok = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": messages("hi"), "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


def test_client_disconnect_aborts_within_a_step(url: str, loop: EngineLoop) -> None:
    body = {
        "model": MODEL,
        "messages": messages("Write a long story about the sea."),
        "max_tokens": 2000,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data:")
            if chunks >= 4:
                break
        assert loop.stats().engine.num_running == 1
    assert wait_idle(loop, 10) < 5.0
    metrics = httpx.get(f"{url}/metrics").text
    assert 'dspark_requests_total{model="smollm2-135m",role="gateway",status="499"}' in metrics


def test_non_streaming_disconnect_aborts(url: str, loop: EngineLoop) -> None:
    body = {
        "model": MODEL,
        "messages": messages("Write a long story about the sea."),
        "max_tokens": 2000,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=2.0)
    wait_idle(loop, 15)


def test_api_keys_body_limit_and_overload(loop: EngineLoop) -> None:
    config = GatewayConfig(api_keys=("k1", "k2"), max_body_bytes=4096, pool=PoolConfig(max_inflight_per_worker=1))
    with start_gateway(loop, config) as url:
        wait_ready(url, 60)
        body = {"model": MODEL, "messages": messages("hi"), "max_tokens": 2}
        missing = httpx.post(f"{url}/v1/chat/completions", json=body)
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.get(f"{url}/v1/models").status_code == 401
        for public in ("/health", "/ready", "/metrics"):
            assert httpx.get(url + public).status_code == 200
        auth = {"Authorization": "Bearer k2"}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth).status_code == 200
        big = httpx.post(f"{url}/v1/chat/completions", headers=auth, json={**body, "messages": messages("x" * 5000)})
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

        long_body = {**body, "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=long_body, headers=auth, timeout=60) as held:
            lines = held.iter_lines()  # keep the iterator: dropping it closes the connection
            assert next(lines).startswith("data:")
            refused = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "server_overloaded"
        wait_idle(loop, 10)
        assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth).status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert 'dspark_requests_total{model="smollm2-135m",role="gateway",status="429"} 1.0' in metrics
        assert 'dspark_requests_total{model="unknown",role="gateway",status="413"} 1.0' in metrics
        assert 'dspark_requests_total{model="unknown",role="gateway",status="401"} 2.0' in metrics


def test_capacity_gates_requests_not_their_own_choices(loop: EngineLoop) -> None:
    """A request admitted to an idle worker gets all its choices even past the worker's
    capacity (docs/design.md §5.4); a request arriving while the worker is full is refused."""
    config = GatewayConfig(pool=PoolConfig(max_inflight_per_worker=2))
    with start_gateway(loop, config) as url:
        wait_ready(url, 60)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        three = client.chat.completions.create(
            model=MODEL,
            messages=messages("Name a colour."),
            max_tokens=4,
            n=3,
            temperature=1.0,
            seed=7,
            extra_body={"ignore_eos": True},
        )
        assert sorted(c.index for c in three.choices) == [0, 1, 2]
        assert [c.finish_reason for c in three.choices] == ["length"] * 3
        assert three.usage is not None and three.usage.completion_tokens == 12
        wait_idle(loop, 10)

        body = {"model": MODEL, "messages": messages("hi"), "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "n": 2}, timeout=60) as held:
            lines = held.iter_lines()  # keep the iterator: dropping it closes the connection
            assert next(lines).startswith("data:")
            refused = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2})
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "server_overloaded"
        wait_idle(loop, 10)


def test_served_model_name_renames_the_model(loop: EngineLoop) -> None:
    with start_gateway(loop, GatewayConfig(served_model_names=("my-model", "alias"))) as url:
        wait_ready(url, 60)
        listed = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
        assert listed == ["my-model", "alias"]
        for requested in ("alias", MODEL):  # the workers' own id stays accepted
            body = {"model": requested, "messages": messages("hi"), "max_tokens": 2}
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 200 and response.json()["model"] == "my-model"
            details = response.json()["usage"]["completion_tokens_details"]
            assert details == {"reasoning_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        unknown = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "gpt-9"}, timeout=60)
        assert unknown.status_code == 404
