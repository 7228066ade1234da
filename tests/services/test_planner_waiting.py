"""Requests waiting for a decode slot after their prefill count as waiting, in the worker's
stats, in the gateway's `dspark_num_requests_waiting{role="decode"}` and so in the planner's
decode signal."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from engine.core import EngineStats
from services.gateway.telemetry import WorkerStatsExporter
from services.metrics import Metrics
from services.planner.prometheus import SignalQueries
from services.workers.engine_loop import EngineLoop
from services.workers.transfer import InProcessTransfer
from services.workers.types import Role


class HeldEngine:
    """An engine that holds `requests`, of which `running` run and `waiting` are queued; the rest
    sit in its hand-off queue."""

    model_name = "m"
    max_model_len = 64
    tokenizer = None
    num_held = 0  # no KV held for a device hand-off

    def __init__(self, held: int, running: int, waiting: int) -> None:
        self.requests = {f"r{i}": object() for i in range(held)}
        self.running, self.waiting = running, waiting

    def stats(self) -> EngineStats:
        zero: dict[str, Any] = {f.name: 0 for f in dataclasses.fields(EngineStats)}
        zero.update(spec_accept_length_counts=(), spec_accepted_per_position=(), kv_usage_ratio=0.0)
        return EngineStats(**{**zero, "num_running": self.running, "num_waiting": self.waiting})

    def has_unfinished_requests(self) -> bool:
        return False


def snapshot(role: Role, engine: HeldEngine) -> EngineStats:
    loop = EngineLoop(
        engine,  # type: ignore[arg-type]
        role=role,
        replica_id=f"{role}-0",
        transfer=InProcessTransfer(),
        max_num_seqs=8,
        speculative=False,
    ).start()
    try:
        deadline = time.monotonic() + 5
        while loop.stats().engine.num_running != engine.running:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return loop.stats().engine
    finally:
        loop.shutdown()


def test_decode_handoff_queue_counts_as_waiting() -> None:
    # 64 hand-offs wait for KV slots behind 8 running requests and 2 in the scheduler's queue.
    stats = snapshot("decode", HeldEngine(held=74, running=8, waiting=2))
    assert stats.num_waiting == 66 and stats.num_running == 8


@pytest.mark.parametrize("role", ["prefill", "worker"])
def test_other_roles(role: Role) -> None:
    # A prefill worker's held requests are finished prefills waiting for a decode worker.
    stats = snapshot(role, HeldEngine(held=5, running=1, waiting=1))
    assert stats.num_waiting == (1 if role == "prefill" else 4)


def test_gateway_gauge_and_planner_decode_signal_include_the_handoff_queue() -> None:
    metrics = Metrics()
    exporter = WorkerStatsExporter(metrics)
    stats = snapshot("decode", HeldEngine(held=64, running=0, waiting=0))
    exporter.update("decode-0", "decode", "m", "i", stats)
    waiting = metrics.registry.get_sample_value("dspark_num_requests_waiting", {"model": "m", "role": "decode"})
    assert waiting == 64
    query = SignalQueries(model="m").waiting("decode")
    assert 'dspark_num_requests_waiting{role="decode"' in query
