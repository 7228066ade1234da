"""Per-caller rate limits (docs/design.md §6.8): the token buckets on a fake clock, then the
in-process gateway over the real engine with the official `openai` SDK: keys limited apart,
OpenAI's 429 with `Retry-After`, keys never logged, client addresses without keys."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from services.gateway import GatewayConfig
from services.gateway import rate_limit as rate_limit_module
from services.gateway.config import AdmissionConfig
from services.gateway.errors import RateLimited
from services.gateway.rate_limit import RateLimiter
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

pytestmark = pytest.mark.timeout(600)

KEYS = ("sk-alpha-3f9c2e71d0", "sk-bravo-8a1b44c6e2")


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def refusal(limiter: RateLimiter, caller: str) -> RateLimited:
    with pytest.raises(RateLimited) as refused:
        limiter.admit(caller)
    return refused.value


def test_requests_per_minute_refill_continuously() -> None:
    clock = Clock()
    limiter = RateLimiter(rpm=2, tpm=0, clock=clock)
    limiter.admit("a")
    limiter.admit("a")
    error = refusal(limiter, "a")
    assert (error.status, error.type, error.code) == (429, "requests", "rate_limit_exceeded")
    assert error.headers["Retry-After"] == "30"  # one request every 30 s
    limiter.admit("b")  # callers are limited apart
    clock.now_s += 29.0
    assert refusal(limiter, "a").headers["Retry-After"] == "1"
    clock.now_s += 1.0
    limiter.admit("a")


def test_tokens_are_charged_as_they_become_known_and_debt_waits() -> None:
    clock = Clock()
    limiter = RateLimiter(rpm=0, tpm=600, clock=clock)  # 10 tokens a second
    charge = limiter.admit("a")
    charge(500)  # the prompt tokens, when the choices start
    second = limiter.admit("a")  # 100 left: admitted
    charge(300)  # the first request's completion tokens, when it ends
    second(100)  # 600 + 300 charged: 300 in debt
    error = refusal(limiter, "a")
    assert (error.type, error.code) == ("tokens", "rate_limit_exceeded")
    assert error.headers["Retry-After"] == "31"  # to get back above zero: 301 tokens at 10/s
    assert "Limit 600, Used 900" in error.message
    clock.now_s += 31.0
    limiter.admit("a")


def test_full_buckets_are_forgotten_past_the_caller_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rate_limit_module, "MAX_IDLE_CALLERS", 3)
    clock = Clock()
    limiter = RateLimiter(rpm=60, tpm=0, clock=clock)
    for caller in ("a", "b", "c"):
        limiter.admit(caller)
    clock.now_s += 2.0  # refilled: full again
    limiter.admit("d")
    assert set(limiter._callers) == {"d"}
    assert RateLimiter(rpm=0, tpm=0).admit("anyone")(10**9) is None  # off: nothing is kept


def test_each_key_has_its_own_limits_and_is_never_logged(loop: EngineLoop, caplog: pytest.LogCaptureFixture) -> None:
    config = GatewayConfig(api_keys=KEYS, admission=AdmissionConfig(rate_limit_rpm=2))
    with caplog.at_level(logging.DEBUG), start_gateway(loop, config) as url:
        wait_ready(url, 60)
        alpha, bravo = (openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) for key in KEYS)
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            alpha.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError) as refused:
            alpha.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
        response = refused.value.response
        assert response.headers["retry-after"] == "30"
        assert response.json()["error"] == {
            "message": "Rate limit reached on requests per min (RPM): Limit 2. Please try again in 30s.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        bravo.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        metrics = httpx.get(f"{url}/metrics").text
        assert 'dspark_requests_total{model="unknown",role="gateway",status="429"} 1.0' in metrics
    assert all(key not in caplog.text and key not in metrics for key in KEYS)


def test_tokens_per_minute_per_client_address_without_keys(loop: EngineLoop) -> None:
    config = GatewayConfig(admission=AdmissionConfig(rate_limit_tpm=100))
    with start_gateway(loop, config) as url:
        wait_ready(url, 60)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        first = client.completions.create(model=MODEL, prompt=list(range(1000, 1150)), max_tokens=4)
        assert first.usage is not None and first.usage.prompt_tokens == 150
        with pytest.raises(openai.RateLimitError) as refused:  # 150 + 4 charged: in debt
            client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
        assert refused.value.response.json()["error"]["type"] == "tokens"
        assert 30 <= int(refused.value.response.headers["retry-after"]) <= 34  # ~55 tokens at 100/min
