"""`dspark-serve drain` as an operator (or a pod's preStop) runs it, against a live Ray cluster
(docs/design.md §6.9): a real `dspark-serve up` process serves greedy streams from two workers,
the real `drain` command drains one of them by name, and every stream completes with the text
of an undisturbed run through the same stack while the drained worker ends empty.

tests/services/test_drain_migration.py covers the drain's rules in-process; this one is the
command: its Ray connection, its choice of worker, and the gateway of another process."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from services.workers.types import StatsSnapshot
from tests.services.cli_process import ROOT, dspark_serve, wait_for_line
from tests.services.conftest import KV_BYTES
from tests.services.serving import free_port
from tests.services.stack import stream_story

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NAMESPACE, DEPLOYMENT = "cli-drain-test", "drn"
WORKERS = [f"{DEPLOYMENT}-worker-0", f"{DEPLOYMENT}-worker-1"]
STORIES = [f"Tell a long story number {i}." for i in range(4)]
STORY_TOKENS = 160
GRACE_S = 0.5  # over long before the streams can end: what the victim holds then must move


def streams(
    url: str, progress: list[int], pool: concurrent.futures.ThreadPoolExecutor
) -> list[concurrent.futures.Future[str]]:
    return [pool.submit(stream_story, url, q, STORY_TOKENS, progress, i) for i, q in enumerate(STORIES)]


def run_drain(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The real `dspark-serve drain ARGS`, to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "drain", *args],
        cwd=ROOT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def stats_of(worker: Any) -> StatsSnapshot:
    stats: StatsSnapshot = ray.get(worker.stats.remote(), timeout=30)
    return stats


def drain_migrations(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("dspark_request_migrations_total{") and 'reason="drain"' in line
    )


def test_dspark_serve_drain_moves_the_named_workers_streams_to_the_other(ray_cluster: None, tmp_path: Path) -> None:
    address = ray.get_runtime_context().gcs_address  # the session's cluster, joined by both commands
    cluster = ["--ray-address", address, "--namespace", NAMESPACE, "--deployment", DEPLOYMENT]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    up_args = ["up", *cluster, "--colocated", "--workers", "2", "--port", str(port)]
    with dspark_serve(*up_args, "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(KV_BYTES), log=log) as up:
        assert "worker=2" in wait_for_line(log, "dspark-serve ready:", up, 900)
        handles = {name: ray.get_actor(name, namespace=NAMESPACE) for name in WORKERS}
        unknown = run_drain([*cluster, "--worker", f"{DEPLOYMENT}-worker-7"])
        assert unknown.returncode != 0 and f"{DEPLOYMENT}-worker-7" in unknown.stderr
        assert ", ".join(WORKERS) in unknown.stderr  # what it could have named
        elsewhere = run_drain([*cluster, "--host", "no-such-host"])  # a preStop on a node without workers
        assert elsewhere.returncode == 0 and f"no workers of {DEPLOYMENT!r} on no-such-host" in elsewhere.stdout
        progress = [0] * len(STORIES)
        with concurrent.futures.ThreadPoolExecutor(len(STORIES)) as pool:
            undisturbed = [f.result(timeout=600) for f in streams(url, progress, pool)]

            progress = [0] * len(STORIES)
            futures = streams(url, progress, pool)
            deadline = time.monotonic() + 300
            while min(progress) < 8:
                assert time.monotonic() < deadline, progress
                time.sleep(0.02)
            # prefix affinity may put every story on one worker, either one: drain the busier
            held = {name: stats_of(h).num_held for name, h in handles.items()}
            victim_name = max(held, key=lambda name: held[name])
            victim = handles[victim_name]
            assert held[victim_name] > 0, held
            drain = run_drain([*cluster, "--worker", victim_name, "--shutdown-grace", str(GRACE_S)])
            assert drain.returncode == 0, drain.stderr[-3000:]
            assert f"dspark-serve drain: {victim_name} drained" in drain.stdout
            assert stats_of(victim).num_held == 0  # at once: `ray stop` may follow
            texts = [f.result(timeout=600) for f in futures]

        assert texts == undisturbed
        assert drain_migrations(url) >= 1
        deadline = time.monotonic() + 30
        while True:
            stats = stats_of(victim)
            if stats.num_held == 0 and stats.engine.num_running == 0 and stats.engine.kv_used_slots == 0:
                break
            assert time.monotonic() < deadline, f"the drained worker still holds work: {stats}"
            time.sleep(0.1)
        assert stats.draining
