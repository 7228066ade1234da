"""`POST /tokenize`, `POST /detokenize` and `GET /version` against the real app over the real
engine on the embedded model (the in-process gateway of conftest.py): the ids are the
engine tokenizer's and, for a conversation, the chat endpoint's; errors, auth, metrics,
and a body near the size limit tokenised without stalling an open stream."""

from __future__ import annotations

import importlib.metadata
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomllib

from services.gateway import GatewayConfig, create_app, utility_routes
from services.gateway.pool import StaticDiscovery
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, chat_token_ids, start_gateway
from tests.services.serving import serve, wait_ready

pytestmark = pytest.mark.timeout(600)

TEXTS = [
    "The capital of France is Paris.",
    "héllo wörld, ça va? Grüße aus Köln",
    "日本語のテキストと中文文本",
    "emoji 🙂👍🏽 and a flag 🇫🇷",
    "tabs\tand\nnew lines  with  double spaces ",
    "",
]


def post(url: str, path: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60, **kwargs)


def tokenize(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = post(url, "/tokenize", body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def detokenize(url: str, tokens: list[int]) -> str:
    response = post(url, "/detokenize", {"model": MODEL, "tokens": tokens})
    assert response.status_code == 200, response.text
    return str(response.json()["prompt"])


def test_tokenize_a_prompt_gives_the_engine_tokenizer_ids(url: str, engine_core: Any) -> None:
    tokenizer = engine_core.tokenizer
    max_model_len = httpx.get(f"{url}/v1/models/{MODEL}").json()["max_model_len"]
    for text in TEXTS:
        result = tokenize(url, {"model": MODEL, "prompt": text})
        expected = tokenizer.encode(text, add_special_tokens=True)
        assert result == {
            "count": len(expected),
            "max_model_len": max_model_len,
            "tokens": expected,
            "token_strs": None,
        }
        plain = tokenize(url, {"prompt": text, "add_special_tokens": False, "return_token_strs": True})
        assert plain["tokens"] == tokenizer.encode(text, add_special_tokens=False)
        assert plain["token_strs"] == tokenizer.convert_ids_to_tokens(plain["tokens"])


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "developer", "content": "Answer in one word. Réponds en un mot."},
        {"role": "user", "content": [{"type": "text", "text": "Capital of"}, {"type": "text", "text": "Japan? 日本"}]},
        {"role": "assistant", "content": "Tokyo."},
        {"role": "user", "content": "And of Italy?"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_tokenize_a_conversation_gives_the_chat_endpoint_ids(
    url: str, engine_core: Any, messages: list[dict[str, Any]]
) -> None:
    result = tokenize(url, {"model": MODEL, "messages": messages, "return_token_strs": True})
    chat = post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
    assert chat.status_code == 200, chat.text
    assert result["count"] == len(result["tokens"]) == chat.json()["usage"]["prompt_tokens"]
    tokenizer = engine_core.tokenizer
    assert result["token_strs"] == tokenizer.convert_ids_to_tokens(result["tokens"])
    if len(messages) == 1:
        assert result["tokens"] == chat_token_ids(engine_core, messages[0]["content"])
    # the chat endpoint's rendering: developer is system, text parts are joined by newlines
    rendered = tokenizer.apply_chat_template(
        [{"role": "system" if m["role"] == "developer" else m["role"], "content": text_of(m)} for m in messages]
    )
    assert result["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert detokenize(url, result["tokens"]) == rendered


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


def test_detokenize_inverts_tokenize(url: str) -> None:
    for text in TEXTS:
        assert detokenize(url, tokenize(url, {"model": MODEL, "prompt": text})["tokens"]) == text


BAD_BODIES: list[tuple[str, bytes, int, str | None]] = [
    ("/tokenize", b"{", 400, None),
    ("/tokenize", b"[1]", 400, None),
    ("/tokenize", b'{"model": "smollm2-135m"}', 400, "prompt"),
    ("/tokenize", b'{"model": "smollm2-135m", "prompt": 5}', 400, "prompt"),
    ("/tokenize", b'{"model": "smollm2-135m", "prompt": ["a"]}', 400, "prompt"),
    ("/tokenize", b'{"model": 7, "prompt": "x"}', 400, "model"),
    ("/tokenize", b'{"model": "smollm2-135m", "prompt": "x", "add_special_tokens": "yes"}', 400, "add_special_tokens"),
    ("/tokenize", b'{"model": "smollm2-135m", "prompt": "x", "return_token_strs": 1}', 400, "return_token_strs"),
    ("/tokenize", b'{"model": "smollm2-135m", "prompt": "x", "messages": []}', 400, "prompt"),
    ("/tokenize", b'{"model": "smollm2-135m", "messages": []}', 400, "messages"),
    ("/tokenize", b'{"model": "smollm2-135m", "messages": "hi"}', 400, "messages"),
    (
        "/tokenize",
        b'{"model": "smollm2-135m", "messages": [{"role": "wizard", "content": "hi"}]}',
        400,
        "messages[0].role",
    ),
    (
        "/tokenize",
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": 3}]}',
        400,
        "messages[0].content",
    ),
    (
        "/tokenize",
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 0}',
        400,
        "add_generation_prompt",
    ),
    (
        "/tokenize",
        b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
        400,
        "tools[0].function",
    ),
    ("/tokenize", b'{"model": "gpt-9", "prompt": "x"}', 404, "model"),
    ("/tokenize", b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ("/detokenize", b'{"model": "smollm2-135m"}', 400, "tokens"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": "1 2"}', 400, "tokens"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": [1, "a"]}', 400, "tokens[1]"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": [true]}', 400, "tokens[0]"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": [1.5]}', 400, "tokens[0]"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": [1, -1]}', 400, "tokens"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": [49152]}', 400, "tokens"),
    ("/detokenize", b'{"model": "smollm2-135m", "tokens": [1180591620717411303424]}', 400, "tokens"),
    ("/detokenize", b'{"model": "gpt-9", "tokens": [1]}', 404, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_BODIES)
def test_bad_bodies_get_openai_errors(url: str, path: str, body: bytes, status: int, param: str | None) -> None:
    response = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error


def test_no_worker_yet_is_503_and_version_answers() -> None:
    with serve(create_app(StaticDiscovery([]))) as url:
        refused = post(url, "/tokenize", {"model": MODEL, "prompt": "hi"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "no_workers"
        assert post(url, "/detokenize", {"model": MODEL, "tokens": [1]}).status_code == 503
        assert httpx.get(f"{url}/version").status_code == 200


def test_version(url: str) -> None:
    assert httpx.get(f"{url}/version").json() == {"version": importlib.metadata.version("dspark-serve")}


def test_version_from_the_source_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(utility_routes.importlib.metadata, "version", not_installed)
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert utility_routes.package_version() == tomllib.loads(pyproject.read_text())["project"]["version"]


def test_api_keys_body_limit_and_refusal_metrics(loop: EngineLoop) -> None:
    with start_gateway(loop, GatewayConfig(api_keys=("k1",), max_body_bytes=4096)) as url:
        wait_ready(url, 60)
        body = {"model": MODEL, "prompt": "hi"}
        assert post(url, "/tokenize", body).status_code == 401
        wrong = post(url, "/detokenize", {"model": MODEL, "tokens": [1]}, headers={"Authorization": "Bearer k2"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        auth = {"Authorization": "Bearer k1"}
        assert post(url, "/tokenize", body, headers=auth).json()["count"] == 1
        assert post(url, "/detokenize", {"model": MODEL, "tokens": [6004]}, headers=auth).json() == {"prompt": "hi"}
        assert httpx.get(f"{url}/version").status_code == 200  # public, as /health is
        big = post(url, "/tokenize", {"model": MODEL, "prompt": "x" * 5000}, headers=auth)
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        assert post(url, "/tokenize", {"model": MODEL, "prompt": 1}, headers=auth).status_code == 400
        assert post(url, "/detokenize", {"model": "gpt-9", "tokens": [1]}, headers=auth).status_code == 404
        metrics = httpx.get(f"{url}/metrics").text
        refused = 'dspark_requests_total{model="%s",role="gateway",status="%d"} %d.0'
        assert refused % ("unknown", 401, 2) in metrics  # the body is not read without a key
        assert refused % ("unknown", 413, 1) in metrics
        assert refused % ("unknown", 404, 1) in metrics
        assert refused % (MODEL, 400, 1) in metrics
        assert refused % (MODEL, 200, 0) in metrics  # tokenizer calls served are not generation requests


def test_a_body_near_the_size_limit_does_not_stall_an_open_stream(url: str) -> None:
    prompt = ("The quick brown fox jumps over the lazy dog; Köln, 日本, 🙂.\n" * 120_000)[:6_500_000]
    content = json.dumps({"model": MODEL, "prompt": prompt}, ensure_ascii=False).encode()
    assert 7_000_000 < len(content) < GatewayConfig().max_body_bytes
    window: dict[str, float] = {}
    result: dict[str, Any] = {}

    def tokenize_big() -> None:
        window["start"] = time.monotonic()
        with httpx.stream(
            "POST", f"{url}/tokenize", content=content, headers={"content-type": "application/json"}, timeout=300
        ) as response:
            window["end"] = time.monotonic()  # headers come once the ids are rendered
            result.update(status=response.status_code, body=json.loads(response.read()))

    stream_body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals: list[float] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=stream_body, timeout=60) as stream:
        lines = stream.iter_lines()
        while not next(lines).startswith("data:"):
            pass
        worker = threading.Thread(target=tokenize_big)
        worker.start()
        for line in lines:
            if line.startswith("data:"):
                arrivals.append(time.monotonic())
            if "end" in window or not worker.is_alive():
                break
        worker.join(300)
    assert result["status"] == 200 and result["body"]["count"] == len(result["body"]["tokens"]) > 1_000_000
    duration_s = window["end"] - window["start"]
    during = [window["start"], *(t for t in arrivals if window["start"] <= t <= window["end"]), window["end"]]
    longest_gap_s = max(b - a for a, b in zip(during, during[1:], strict=False))
    assert duration_s > 1.0 and longest_gap_s < duration_s / 2, (duration_s, longest_gap_s, len(during))
