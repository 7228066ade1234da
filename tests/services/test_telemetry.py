"""Metric recording at the gateway: request timers, phase partition, worker stats export."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import generate_latest

from engine.core import EngineStats
from engine.outputs import RequestTimings
from engine.sampling_params import SamplingParams
from services.gateway.telemetry import RequestMetrics, RequestTimer, WorkerStatsExporter, first_token_hops
from services.gateway.tracked import Tracked
from services.metrics import Metrics
from services.workers.outbox import Outbox
from services.workers.types import WorkerEvent


def stats(**values: object) -> EngineStats:
    base: dict[str, object] = dict(
        num_running=0,
        num_waiting=0,
        kv_usage_ratio=0.0,
        kv_used_slots=0,
        kv_total_slots=100,
        prompt_tokens_total=0,
        generation_tokens_total=0,
        prefix_cache_hits_total=0,
        prefix_cache_queries_total=0,
        spec_draft_tokens_total=0,
        spec_accepted_tokens_total=0,
        spec_verify_steps_total=0,
        spec_accept_length_counts=(),
        spec_accepted_per_position=(),
        num_preemptions=0,
        steps_total=0,
    )
    base.update(values)
    return EngineStats(**base)  # type: ignore[arg-type]


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_timer_itl_is_per_token() -> None:
    timer = RequestTimer(arrival_s=0.0)
    timer.content_sent(1, now=1.0)  # first content: TTFT 1.0
    timer.content_sent(2, now=1.4)  # two tokens in one chunk: 0.2 each
    timer.content_sent(1, now=1.5)
    assert timer.first_content_s == 1.0
    assert [round(x, 6) for x in timer.itl_s] == [0.2, 0.2, 0.1]


def tracked(**times: float | None) -> Tracked:
    t = Tracked(
        "r",
        0,
        [1, 2],
        SamplingParams(),
        asyncio.Queue(),
        0.0,
        first_role="prefill",
        decode_role="decode",
    )
    for name, value in times.items():
        setattr(t, name, value)
    return t


def test_phases_partition_arrival_to_last_token() -> None:
    metrics = Metrics()
    recorder = RequestMetrics(metrics)
    timer = RequestTimer(arrival_s=0.0)
    timer.content_sent(1, now=1.0)
    timer.content_sent(9, now=3.0)
    pd = tracked(first_token_s=1.0, prefill_s=0.7, handoff_s=1.0, decode_start_s=1.2, last_token_s=3.0)
    recorder.finished("m", timer, [pd], 200, prompt_tokens=5, completion_tokens=10, max_choice_tokens=10, end_s=3.01)
    labels = {"model": "m", "role": "gateway"}
    prefill, decode = {"model": "m", "role": "prefill"}, {"model": "m", "role": "decode"}
    phases = [
        sample(metrics, f"dspark_{name}_sum", **role)
        for name, role in (
            ("request_queue_time_seconds", prefill),
            ("request_prefill_time_seconds", prefill),
            ("kv_transfer_time_seconds", decode),
            ("request_decode_time_seconds", decode),
        )
    ]
    assert [round(p, 6) for p in phases] == [0.3, 0.7, 0.2, 1.8]
    assert abs(sum(phases) - sample(metrics, "dspark_e2e_request_latency_seconds_sum", **labels)) < 0.02
    assert sample(metrics, "dspark_time_to_first_token_seconds_sum", **labels) == 1.0
    assert round(sample(metrics, "dspark_time_per_output_token_seconds_sum", **labels), 6) == round(2.01 / 9, 6)
    assert sample(metrics, "dspark_requests_total", status="200", **labels) == 1
    assert sample(metrics, "dspark_prompt_tokens_total", **labels) == 5
    assert sample(metrics, "dspark_generation_tokens_total", **labels) == 10


def test_first_token_hops_partition_arrival_to_first_content(caplog: pytest.LogCaptureFixture) -> None:
    timer = RequestTimer(arrival_s=10.0)
    timer.content_sent(1, now=10.5)
    worker = RequestTimings(arrival_s=10.03, first_scheduled_s=10.04, first_token_s=10.44)
    t = tracked(submitted_s=10.01, worker_timings=worker, first_token_s=10.46, last_token_s=10.46)
    hops = first_token_hops(timer, t)
    assert hops is not None
    assert {name: round(s, 6) for name, s in hops.items()} == {
        "prepare": 0.01,
        "submit": 0.02,
        "wait": 0.01,
        "prefill": 0.4,
        "back": 0.02,
        "send": 0.04,
    }
    assert abs(sum(hops.values()) - 0.5) < 1e-9
    with caplog.at_level(logging.DEBUG, logger="services.gateway.telemetry"):
        RequestMetrics(Metrics()).finished("m", timer, [t], 200, 5, 1, 1, end_s=10.5)
    assert "request r first token hops ms: prepare=10.0 submit=20.0 wait=10.0 prefill=400.0" in caplog.text
    t.migrations = 1  # the first token came from a worker it was moved to: no single path to show
    assert first_token_hops(timer, t) is None
    assert first_token_hops(timer, tracked(first_token_s=10.46)) is None  # no worker timings


def test_failed_requests_are_counted_but_not_timed() -> None:
    metrics = Metrics()
    recorder = RequestMetrics(metrics)
    recorder.finished(
        "m", RequestTimer(0.0), [tracked()], 500, prompt_tokens=3, completion_tokens=0, max_choice_tokens=0
    )
    recorder.count("m", 429)
    labels = {"model": "m", "role": "gateway"}
    assert sample(metrics, "dspark_requests_total", status="500", **labels) == 1
    assert sample(metrics, "dspark_requests_total", status="429", **labels) == 1
    assert sample(metrics, "dspark_e2e_request_latency_seconds_count", **labels) == 0


def test_gateway_queue_gauges_move_once() -> None:
    metrics = Metrics()
    recorder = RequestMetrics(metrics)
    labels = {"model": "m", "role": "gateway"}
    a, b = recorder.inflight("m"), recorder.inflight("m")
    assert sample(metrics, "dspark_num_requests_waiting", **labels) == 2
    a.started()
    a.started()
    assert sample(metrics, "dspark_num_requests_waiting", **labels) == 1
    assert sample(metrics, "dspark_num_requests_running", **labels) == 1
    a.ended()
    b.ended()
    b.ended()
    assert sample(metrics, "dspark_num_requests_waiting", **labels) == 0
    assert sample(metrics, "dspark_num_requests_running", **labels) == 0


def test_worker_counters_stay_monotonic_across_restarts() -> None:
    metrics = Metrics()
    exporter = WorkerStatsExporter(metrics)
    labels = {"model": "m", "role": "decode"}
    exporter.update("d0", "decode", "m", "i1", stats(generation_tokens_total=10, spec_accept_length_counts=(0, 2, 3)))
    exporter.update("d0", "decode", "m", "i1", stats(generation_tokens_total=25, spec_accept_length_counts=(0, 2, 4)))
    assert sample(metrics, "dspark_generation_tokens_total", **labels) == 25
    exporter.update("d0", "decode", "m", "i2", stats(generation_tokens_total=5))  # restarted: counts from 0
    assert sample(metrics, "dspark_generation_tokens_total", **labels) == 30
    assert sample(metrics, "dspark_spec_accept_length_count", **labels) == 6
    assert sample(metrics, "dspark_spec_accept_length_sum", **labels) == 2 * 1 + 4 * 2


def test_undrafted_tokens_are_exported() -> None:
    metrics = Metrics()
    exporter = WorkerStatsExporter(metrics)
    exporter.update("d0", "decode", "m", "i1", stats(spec_undrafted_tokens_total=7))
    exporter.update("d0", "decode", "m", "i1", stats(spec_undrafted_tokens_total=12))
    assert sample(metrics, "dspark_spec_undrafted_tokens_total", model="m", role="decode") == 12


def test_worker_gauges_aggregate_per_role_over_live_workers() -> None:
    metrics = Metrics()
    exporter = WorkerStatsExporter(metrics)
    exporter.update("d0", "decode", "m", "a", stats(num_running=3, kv_used_slots=50, kv_total_slots=100))
    exporter.update("d1", "decode", "m", "b", stats(num_running=1, kv_used_slots=10, kv_total_slots=300))
    labels = {"model": "m", "role": "decode"}
    assert sample(metrics, "dspark_num_requests_running", **labels) == 4
    assert sample(metrics, "dspark_kv_cache_usage_ratio", **labels) == 60 / 400
    exporter.set_live("d0", False)
    assert sample(metrics, "dspark_num_requests_running", **labels) == 1
    exporter.remove("d1")
    assert sample(metrics, "dspark_num_requests_running", **labels) == 0
    assert b"dspark_kv_cache_usage_ratio" in generate_latest(metrics.registry)


def test_outbox_long_poll() -> None:
    from engine.outputs import RequestOutput

    async def scenario() -> None:
        outbox = Outbox()
        assert await outbox.take("g", 0.05) == []
        waiter = asyncio.create_task(outbox.take("g", 5.0))
        await asyncio.sleep(0.05)
        event = WorkerEvent(RequestOutput("r", (1,), "a", (1,)))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, outbox.put_many, {"g": [event], "other": [event]})
        assert await asyncio.wait_for(waiter, 1.0) == [event]
        assert outbox.buffered("other") == 1
        assert outbox.idle_consumers(lease_s=1000) == []
        outbox.drop("other")
        assert outbox.buffered("other") == 0

    asyncio.run(scenario())


def test_series_are_declared_at_zero_before_traffic() -> None:
    metrics = Metrics()
    RequestMetrics(metrics).declare("m", "prefill")
    RequestMetrics(metrics).declare("m", "decode")
    text = generate_latest(metrics.registry).decode()
    assert 'dspark_time_to_first_token_seconds_count{model="m",role="gateway"} 0.0' in text
    assert 'dspark_requests_total{model="m",role="gateway",status="200"} 0.0' in text
    assert 'dspark_request_prefill_time_seconds_count{model="m",role="prefill"} 0.0' in text
    assert 'dspark_kv_transfer_time_seconds_count{model="m",role="decode"} 0.0' in text
    assert 'dspark_kv_transfer_time_seconds_count{model="m",role="prefill"}' not in text
