"""The planner end to end: a real Prometheus on loopback scrapes a small exporter of our
metrics; the planner reads it and patches a RayCluster held by a strict stand-in for the
Kubernetes API server (tests/services/kube_api.py; none can run here), which serves the
official client on loopback.

Exercises `dspark-serve planner --once` (scale-up on a TTFT breach) and then the loop's
evaluation with carried state (scale-down after the cool-down once TTFT is healthy).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from services.metrics import Metrics
from tests.services.kube_api import JSON_PATCH, StrictKubeApi
from tests.services.prometheus import prometheus_binary, run_prometheus

if prometheus_binary() is None and not os.environ.get("CI"):
    pytest.skip("needs the `prometheus` binary (Debian package prometheus)", allow_module_level=True)

MODEL = "m"
NAMESPACE, CLUSTER = "serving", "dspark-ray"
RAYCLUSTERS = "apis/ray.io/v1/rayclusters"


class Exporter:
    """Serves `generate_latest` of one Metrics registry on loopback."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        registry = self.metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def observe(self, ttft_s: float, tpot_s: float, count: int = 50) -> None:
        ttft = self.metrics.histogram("dspark_time_to_first_token_seconds").labels(MODEL, "gateway")
        tpot = self.metrics.histogram("dspark_time_per_output_token_seconds").labels(MODEL, "gateway")
        for _ in range(count):
            ttft.observe(ttft_s)
            tpot.observe(tpot_s)


class IdlePods:
    """Three idle worker pods per group, as their workers would report them."""

    def __init__(self) -> None:
        self.drained: set[str] = set()

    def loads(self, role: str) -> list[Any]:
        from services.planner.drain import PodLoad

        return [PodLoad(f"{role}-{i}", 0, f"{role}-{i}" in self.drained) for i in range(3)]

    def drain(self, role: str, pods: Any) -> None:
        self.drained |= set(pods)


def raycluster() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}},
            "workerGroupSpecs": [
                {"groupName": group, "replicas": 1, "minReplicas": 1, "maxReplicas": 4}
                for group in ("prefill", "decode")
            ],
        },
    }


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Exporter, Any, StrictKubeApi]]:
    exporter = Exporter()
    gauges = exporter.metrics
    for role in ("prefill", "decode"):
        gauges.gauge("dspark_num_requests_waiting").labels(MODEL, role).set(0)
        gauges.gauge("dspark_kv_cache_usage_ratio").labels(MODEL, role).set(0.1)
    kube = StrictKubeApi()
    kube.put(RAYCLUSTERS, raycluster())
    try:
        with run_prometheus(exporter.target, tmp_path) as prometheus:
            yield exporter, prometheus, kube
    finally:
        kube.close()
        exporter.server.shutdown()


def replicas(kube: StrictKubeApi) -> dict[str, int]:
    from services.planner.kube import RayClusterScaler, custom_objects_api

    groups = RayClusterScaler(custom_objects_api(kube.url), NAMESPACE, CLUSTER).worker_groups(("prefill", "decode"))
    return {name: group.replicas for name, group in groups.items()}


def test_planner_scales_prefill_up_on_ttft_then_down_after_cooldown(
    stack: tuple[Exporter, Any, StrictKubeApi],
) -> None:
    from services.cli import main
    from services.planner.drain import Downscaler
    from services.planner.kube import RayClusterScaler, custom_objects_api
    from services.planner.loop import GroupNames, evaluate
    from services.planner.policy import GroupLimits, GroupState, PlannerState, PolicyConfig
    from services.planner.prometheus import PrometheusReader, SignalQueries

    exporter, prometheus, kube = stack
    window = "6s"
    # Breach: TTFT 5 s against a 1 s target; TPOT comfortably inside its band (0.06 of 0.1).
    exporter.observe(ttft_s=5.0, tpot_s=0.06)
    deadline = time.monotonic() + 30
    query = f"histogram_quantile(0.95, sum by (le) (rate(dspark_time_to_first_token_seconds_bucket[{window}])))"
    while not prometheus.query(query) or prometheus.query(query)[0]["value"][1] == "NaN":
        assert time.monotonic() < deadline, "Prometheus never saw the TTFT observations"
        exporter.observe(ttft_s=5.0, tpot_s=0.06, count=5)
        time.sleep(0.5)

    args = [
        "planner", "--once", "--prometheus-url", prometheus.url, "--kube-host", kube.url,
        "--kube-namespace", NAMESPACE, "--raycluster", CLUSTER, "--model", MODEL, "--window", window,
        "--ttft-target-s", "1", "--tpot-target-s", "0.1", "--max-step", "2",
    ]  # fmt: skip
    assert main([*args, "--dry-run"]) == 0
    assert replicas(kube) == {"prefill": 1, "decode": 1}
    assert main(args) == 0
    after_up = replicas(kube)
    assert after_up["prefill"] == 3 and after_up["decode"] == 1  # 1 + max-step; decode untouched

    # Healthy from now on: only fast requests; once the window holds no slow one, p95 is low.
    config = PolicyConfig(
        ttft_target_s=1.0,
        tpot_target_s=0.1,
        prefill=GroupLimits(1, 4),
        decode=GroupLimits(1, 4),
        scale_down_cooldown_s=3.0,
    )
    reader = PrometheusReader(prometheus.url, SignalQueries(model=MODEL, window=window))
    scaler = RayClusterScaler(custom_objects_api(kube.url), NAMESPACE, CLUSTER)
    pods = IdlePods()
    downscaler = Downscaler(pods)  # type: ignore[arg-type]
    # As the long-running loop would have it after the scale-up above: its cool-down running.
    state = PlannerState(prefill=GroupState(last_scale_up_s=time.monotonic()))
    seen: list[str] = []
    start = time.monotonic()
    try:
        while replicas(kube)["prefill"] == 3:
            assert time.monotonic() - start < 30, f"prefill never scaled down: {seen}"
            exporter.observe(ttft_s=0.05, tpot_s=0.01, count=20)
            plan, state = evaluate(config, reader, scaler, GroupNames(), state, time.monotonic(), downscaler=downscaler)
            seen.append(str(plan.prefill))
            assert not plan.decode.changed  # already at its minimum
            time.sleep(0.5)
    finally:
        reader.close()
    assert replicas(kube) == {"prefill": 2, "decode": 1}
    # The idle pod drained first is the one named for deletion.
    spec = kube.get(RAYCLUSTERS, NAMESPACE, CLUSTER)["spec"]["workerGroupSpecs"][0]
    assert spec["scaleStrategy"]["workersToDelete"] == ["prefill-0"] and pods.drained == {"prefill-0"}
    assert {r.content_type for r in kube.patches()} == {JSON_PATCH}
    # The step down came only after a calm stretch of the cool-down.
    assert any("scale-down cool-down" in reason for reason in seen), seen
