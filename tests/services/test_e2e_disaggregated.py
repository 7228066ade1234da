"""End to end, disaggregated: one PrefillWorker and one DecodeWorker on a local Ray cluster,
KV handed off through the Ray object store; the official openai client; a real Prometheus
scraping the gateway; a decode worker killed mid-stream."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray

from services.gateway import GatewayConfig, create_app
from services.gateway.pool import RayDiscovery
from tests.services.conftest import MODEL, chat_token_ids, greedy_reference
from tests.services.prometheus import prometheus_binary, run_prometheus
from tests.services.serving import serve, wait_ready
from tests.services.stack import (
    FAST_POOL,
    QUESTIONS,
    Stack,
    concurrent_streams,
    disconnects_and_streams,
    gateway,
    offline_answers,
    stream_text,
    workers,
)

pytestmark = pytest.mark.timeout(1200)
DEPLOYMENT = "pd"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def handles(ray_cluster: None) -> Iterator[dict[str, Any]]:
    with workers([("prefill", 1), ("decode", 1)], DEPLOYMENT) as spawned:
        yield spawned


@pytest.fixture(scope="module")
def reference(handles: dict[str, Any], engine_core: Any) -> list[str]:
    """Offline greedy answers, computed while the workers load their models."""
    return offline_answers(engine_core, MAX_TOKENS)


@pytest.fixture(scope="module")
def stack(handles: dict[str, Any], reference: list[str]) -> Iterator[Stack]:
    with gateway(handles, DEPLOYMENT) as running:
        yield running


def test_twenty_concurrent_streams_match_the_offline_engine(stack: Stack, reference: list[str]) -> None:
    before = stack.worker_stats()
    assert concurrent_streams(stack.client, QUESTIONS, MAX_TOKENS) == reference
    after = stack.wait_workers_idle()
    prefill, decode = (f"{DEPLOYMENT}-prefill-0", f"{DEPLOYMENT}-decode-0")
    # the prompts were prefilled on the prefill worker and decoded on the decode worker
    assert after[prefill].prompt_tokens_total > before[prefill].prompt_tokens_total
    assert after[decode].generation_tokens_total - before[decode].generation_tokens_total >= len(QUESTIONS)
    assert after[decode].prompt_tokens_total == before[decode].prompt_tokens_total


def test_disconnected_clients_are_aborted_on_both_workers(stack: Stack, reference: list[str]) -> None:
    assert disconnects_and_streams(stack, QUESTIONS[:5], MAX_TOKENS, num_disconnects=5) == reference[:5]
    stack.wait_workers_idle(15)
    metrics = httpx.get(f"{stack.url}/metrics").text
    assert f'dspark_requests_total{{model="{MODEL}",role="gateway",status="499"}} 5.0' in metrics


@pytest.mark.skipif(prometheus_binary() is None, reason="needs the prometheus binary (make system-deps)")
def test_metrics_through_a_real_prometheus(stack: Stack, tmp_path: Path) -> None:
    """A second gateway (fresh metrics) over the same workers, scraped by Prometheus."""
    app = create_app(RayDiscovery(DEPLOYMENT), GatewayConfig(pool=FAST_POOL))
    with serve(app) as url:
        wait_ready(url, 120)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        with run_prometheus(url.removeprefix("http://"), tmp_path) as prom:
            prom.scrapes_after("dspark", time.time())  # a sample before the traffic, for rate()
            sent = 10
            with concurrent.futures.ThreadPoolExecutor(5) as pool:
                texts = list(
                    pool.map(lambda q: stream_text(client, q, 8, extra_body={"ignore_eos": True}), QUESTIONS[:sent])
                )
            assert all(texts)
            time.sleep(1.0)  # the gateway's next worker-stats poll
            prom.scrapes_after("dspark", time.time() + 0.5)
            assert prom.scalar('sum(dspark_requests_total{role="gateway"})') == sent
            assert prom.scalar('sum(dspark_requests_total{role="gateway",status="200"})') == sent
            for name in (
                "time_to_first_token_seconds",
                "time_per_output_token_seconds",
                "e2e_request_latency_seconds",
            ):
                assert prom.scalar(f"sum(dspark_{name}_count)") == sent, name
            for name in (
                "request_queue_time_seconds",
                "request_prefill_time_seconds",
                "kv_transfer_time_seconds",
                "request_decode_time_seconds",
            ):
                assert prom.scalar(f"sum(dspark_{name}_count)") == sent, name
            assert prom.scalar("sum(dspark_inter_token_latency_seconds_count)") >= sent * 6
            for quantile in (0.5, 0.9, 0.99):
                for name in ("time_to_first_token_seconds", "time_per_output_token_seconds"):
                    value = prom.scalar(f"histogram_quantile({quantile}, sum by (le) (rate(dspark_{name}_bucket[1m])))")
                    assert 0 < value < 160, (name, quantile, value)
            phases = prom.scalar(
                "sum(dspark_request_queue_time_seconds_sum) + sum(dspark_request_prefill_time_seconds_sum)"
                " + sum(dspark_kv_transfer_time_seconds_sum) + sum(dspark_request_decode_time_seconds_sum)"
            )
            e2e = prom.scalar("sum(dspark_e2e_request_latency_seconds_sum)")
            assert abs(phases - e2e) <= 0.1 * e2e, (phases, e2e)
            # phases carry the role of the worker that ran them
            assert prom.query('dspark_request_prefill_time_seconds_count{role="prefill"}')
            assert prom.query('dspark_kv_transfer_time_seconds_count{role="decode"}')
            # engine statistics of both workers arrive through the same scrape
            assert prom.scalar('sum(dspark_prompt_tokens_total{role="prefill"})') > 0
            assert prom.scalar('sum(dspark_generation_tokens_total{role="decode"})') > 0
            assert prom.scalar('sum(dspark_generation_tokens_total{role="gateway"})') == sent * 8
            assert prom.scalar('sum(dspark_kv_cache_usage_ratio{role="decode"})') == 0.0
            assert prom.query('dspark_prefix_cache_queries_total{role="prefill"}')


STORIES = [f"Tell a long story number {i}." for i in range(10)]
STORY_TOKENS = 96


@pytest.fixture(scope="module")
def stories(handles: dict[str, Any], engine_core: Any) -> list[str]:
    prompts = [chat_token_ids(engine_core, q) for q in STORIES]
    return greedy_reference(engine_core, prompts, STORY_TOKENS, ignore_eos=True)


def test_streams_of_a_killed_decode_worker_move_and_complete_unchanged(
    stack: Stack, reference: list[str], stories: list[str]
) -> None:
    """docs/design.md §5.6: kill -9 of the decode worker under 10 greedy streams; every stream
    goes on elsewhere (here the prefill worker runs them whole) and its text equals the
    undisturbed run; a request sent at the kill gets a normal answer; the worker comes back."""
    client = stack.client
    texts = [""] * len(STORIES)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": STORIES[i]}],
                max_tokens=STORY_TOKENS,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    texts[i] += chunk.choices[0].delta.content
        except openai.APIError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(STORIES))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 180
    while min(len(t) for t in texts) < 8:
        assert time.monotonic() < deadline, texts
        time.sleep(0.02)
    seen_at_kill = [len(t) for t in texts]
    ray.kill(stack.handle("decode"), no_restart=False)
    assert stream_text(client, QUESTIONS[0], MAX_TOKENS) == reference[0]
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert texts == stories
    assert any(len(t) > seen for t, seen in zip(texts, seen_at_kill, strict=True)), "the kill came too late"
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    moved = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("dspark_request_migrations_total{") and 'reason="worker_down"' in line
    )
    assert moved >= 1

    # it comes back (a new process, loading the model again) and is used again
    deadline = time.monotonic() + 600
    while True:
        ready = httpx.get(f"{stack.url}/ready", timeout=10).json()
        decode = [w for w in ready["workers"] if w["role"] == "decode"]
        if decode and all(w["healthy"] for w in decode):
            break
        assert time.monotonic() < deadline, ready
        time.sleep(0.5)
    decode_stats = ray.get(stack.handle("decode").stats.remote(), timeout=60).engine
    assert concurrent_streams(client, QUESTIONS[:4], MAX_TOKENS) == reference[:4]
    after = ray.get(stack.handle("decode").stats.remote(), timeout=60).engine
    assert after.generation_tokens_total > decode_stats.generation_tokens_total
    stack.wait_workers_idle()
