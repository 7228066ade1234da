"""Per-request limits of the in-process gateway over the real engine (docs/design.md §6.8): each
refusal comes before the work it bounds (the gateway's memory barely moves, nothing reaches
the worker, no time is spent tokenising), and a body being tokenised never stalls a stream."""

from __future__ import annotations

import argparse
import gc
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psutil
import pytest

from services.cli.env import apply_env_defaults
from services.cli.options import add_gateway_options, gateway_config_from_args
from services.gateway import GatewayConfig
from services.gateway.config import AdmissionConfig
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

pytestmark = pytest.mark.timeout(600)

TEXT = "The quick brown fox jumps over the lazy dog; Köln, 日本, 🙂.\n"  # 22 tokens
ASCII_TEXT = "The quick brown fox jumps over the lazy dog.\n"  # decodes to one byte a character


@contextmanager
def peak_rss_growth() -> Iterator[dict[str, int]]:
    """Samples this process's resident memory while the block runs; yields {"bytes": peak growth}."""
    process = psutil.Process()
    gc.collect()
    baseline = process.memory_info().rss
    result = {"bytes": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            result["bytes"] = max(result["bytes"], process.memory_info().rss - baseline)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        done.set()
        sampler.join()


def tokenising_s(engine: Any, texts: list[str]) -> float:
    """What tokenising `texts` takes the model's tokenizer here, in seconds."""
    start = time.monotonic()
    for text in texts:
        engine.tokenizer.encode(text, add_special_tokens=False)
    return time.monotonic() - start


def prompt_tokens_seen(loop: EngineLoop) -> int:
    return loop.stats().engine.prompt_tokens_total


def encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


def post(url: str, path: str, body: dict[str, Any] | bytes) -> tuple[httpx.Response, float]:
    content = body if isinstance(body, bytes) else encoded(body)
    start = time.monotonic()
    response = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=120)
    return response, time.monotonic() - start


def assert_refused(response: httpx.Response, param: str, code: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == code, error


def test_the_options_reach_the_gateway_config() -> None:
    parser = argparse.ArgumentParser()
    add_gateway_options(parser)
    apply_env_defaults(parser, {"DSPARK_RATE_LIMIT_TPM": "5000"})
    args = parser.parse_args(
        [
            "--max-choices-per-request",
            "64",
            "--max-tokens-per-request",
            "4096",
            "--tokenizer-threads",
            "3",
            "--rate-limit-rpm",
            "60",
            "--shared-admission",
            "--body-timeout",
            "10",
            "--header-timeout",
            "5",
        ]
    )
    config = gateway_config_from_args(args)
    assert config.admission == AdmissionConfig(64, 4096, 3, 60, 5000, 10.0)
    assert config.pool.shared_admission and args.header_timeout == 5.0
    defaults = gateway_config_from_args(parser.parse_args([]))
    assert defaults.admission.max_choices_per_request == 128 and not defaults.pool.shared_admission
    assert defaults.admission.tokens_per_request(8192) == 16 * 8192
    with pytest.raises(ValueError, match="max_choices_per_request"):
        AdmissionConfig(max_choices_per_request=0)


def test_two_thousand_prompts_are_refused_before_tokenising(url: str, loop: EngineLoop, engine_core: Any) -> None:
    body = {"model": MODEL, "prompt": [f"{i}: " + ASCII_TEXT * 70 for i in range(2000)], "max_tokens": 1}
    content = encoded(body)
    assert 6_000_000 < len(content) < GatewayConfig().max_body_bytes
    seen = prompt_tokens_seen(loop)
    with peak_rss_growth() as growth:
        response, elapsed_s = post(url, "/v1/completions", content)
    assert_refused(response, "prompt", "too_many_choices")
    assert "2000 prompt(s)" in response.json()["error"]["message"]
    # what the body costs: its bytes, its text and its prompts, each about its size; tokenised,
    # the ids and jobs of 2,000 prompts would take far more memory, and seconds
    assert growth["bytes"] < 6 * len(content), growth
    assert elapsed_s < tokenising_s(engine_core, body["prompt"][:200]) * 10 / 4, elapsed_s
    assert prompt_tokens_seen(loop) == seen


def test_a_million_one_character_prompts_cost_only_their_body(url: str) -> None:
    content = encoded({"model": MODEL, "prompt": ["a"] * 1_200_000})
    with peak_rss_growth() as growth:
        response, elapsed_s = post(url, "/v1/completions", content)
    assert_refused(response, "prompt", "too_many_choices")
    # admitted, it grew the gateway by 1.5 GB and kept the workers busy for hours
    assert elapsed_s < 5.0 and growth["bytes"] < 6 * len(content), (elapsed_s, growth)


def test_prompts_times_n_name_n(url: str, loop: EngineLoop) -> None:
    seen = prompt_tokens_seen(loop)
    body = {"model": MODEL, "prompt": [[11, 12, 13]] * 100, "n": 16, "max_tokens": 1}
    response, _ = post(url, "/v1/completions", body)
    assert_refused(response, "n", "too_many_choices")
    assert "1600 choices" in response.json()["error"]["message"]
    assert prompt_tokens_seen(loop) == seen
    # within the limit, and within what the one worker takes at once (2 x max_num_seqs = 64
    # choices): more would pass only if earlier choices finished while later ones were submitted
    within, _ = post(url, "/v1/completions", {**body, "prompt": [[11, 12, 13]] * 2, "n": 16})
    assert within.status_code == 200 and len(within.json()["choices"]) == 32


def test_the_choice_limit_is_an_option(loop: EngineLoop) -> None:
    config = GatewayConfig(admission=AdmissionConfig(max_choices_per_request=4))
    with start_gateway(loop, config) as url:
        wait_ready(url, 60)
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert_refused(post(url, "/v1/chat/completions", {**chat, "n": 5})[0], "n", "too_many_choices")
        assert post(url, "/v1/chat/completions", {**chat, "n": 4})[0].status_code == 200
        completion = {"model": MODEL, "prompt": ["a", "b", "c", "d", "e"], "max_tokens": 1}
        assert_refused(post(url, "/v1/completions", completion)[0], "prompt", "too_many_choices")
        assert_refused(
            post(url, "/v1/completions", {**completion, "prompt": ["a", "b"], "n": 3})[0], "n", "too_many_choices"
        )


def test_completion_tokens_past_the_token_limit_are_refused_before_tokenising(url: str, loop: EngineLoop) -> None:
    # 100 choices x 2,000 tokens > 16 x 8,192 (the default: n=16 full-context choices of one prompt)
    body = {"model": MODEL, "prompt": [TEXT * 50] * 100, "max_tokens": 2000}
    seen = prompt_tokens_seen(loop)
    response, elapsed_s = post(url, "/v1/completions", body)
    assert_refused(response, "max_tokens", "too_many_tokens")
    assert "at most 131072" in response.json()["error"]["message"]
    assert elapsed_s < 1.0 and prompt_tokens_seen(loop) == seen
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 16}  # no max_tokens: all fit
    assert post(url, "/v1/chat/completions", {**chat, "max_tokens": 1})[0].status_code == 200


def test_prompt_tokens_past_the_token_limit_stop_tokenising(loop: EngineLoop, engine_core: Any) -> None:
    config = GatewayConfig(admission=AdmissionConfig(max_tokens_per_request=1000))
    with start_gateway(loop, config) as url:
        wait_ready(url, 60)
        seen = prompt_tokens_seen(loop)
        ids = {"model": MODEL, "prompt": [[20 + i for i in range(600)]] * 2, "max_tokens": 8}
        assert_refused(post(url, "/v1/completions", ids)[0], "prompt", "too_many_tokens")
        # the first of 120 prompts of 6,600 tokens passes the limit: the others are never tokenised
        texts = {"model": MODEL, "prompt": [f"{i}: " + TEXT * 300 for i in range(120)], "max_tokens": 8}
        response, elapsed_s = post(url, "/v1/completions", texts)
        assert_refused(response, "prompt", "too_many_tokens")
        assert elapsed_s < tokenising_s(engine_core, texts["prompt"]) / 4, elapsed_s
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
        assert_refused(
            post(url, "/v1/chat/completions", {**chat, "n": 2, "max_tokens": 600})[0], "max_tokens", "too_many_tokens"
        )
        assert_refused(
            post(url, "/v1/chat/completions", {**chat, "max_tokens": None})[0], "messages", "too_many_tokens"
        )
        assert prompt_tokens_seen(loop) == seen
        assert post(url, "/v1/chat/completions", chat)[0].status_code == 200


def test_a_multi_megabyte_body_being_tokenised_does_not_stall_a_stream(url: str) -> None:
    big = {"model": MODEL, "messages": [{"role": "user", "content": (TEXT * 60_000)[:3_000_000]}], "max_tokens": 1}
    window: dict[str, Any] = {}

    def send_big() -> None:
        window["start"] = time.monotonic()
        window["response"], _ = post(url, "/v1/chat/completions", big)
        window["end"] = time.monotonic()

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
        sender = threading.Thread(target=send_big)
        sender.start()
        for line in lines:
            if line.startswith("data:"):
                arrivals.append(time.monotonic())
            if "end" in window:
                break
        sender.join(300)
    # rendered and tokenised (seconds of work), then refused for its length
    assert window["response"].json()["error"]["code"] == "context_length_exceeded"
    during = [window["start"], *(t for t in arrivals if window["start"] <= t <= window["end"]), window["end"]]
    longest_gap_s = max(b - a for a, b in zip(during, during[1:], strict=False))
    assert window["end"] - window["start"] > 1.0 and longest_gap_s < 1.0, (window, longest_gap_s, len(during))
