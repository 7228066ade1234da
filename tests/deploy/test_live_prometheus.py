"""Every dashboard query, template variable, rule and KEDA trigger, evaluated by a real Prometheus.

A real Prometheus (loopback, ephemeral port, temporary directory, 1 s scrapes) scrapes two small
HTTP servers that serve `prometheus_client.generate_latest(Metrics().registry)`, i.e. the
metrics exactly as services/metrics.py defines them. A background thread keeps recording sample
traffic into every metric (labels model, role, status), so counters and histograms move between
scrapes and rate() has points. The two servers share one registry, as two gateway pods do when
each re-exports the same workers' series: the queries that de-duplicate those copies are checked
by value.

The sample traffic breaks every SLO on purpose (slow first tokens, 10 % 5xx, a deep queue, a full
KV cache) so that every alert expression returns series too.

Prometheus loads charts/dspark-serve/files/rules.yaml with one change, the groups' evaluation
interval (30 s -> 1 s), so that the rules are evaluated within the test.

Dashboard queries reach Prometheus the way Grafana sends them: `deploy_support.grafana_to_promql`
substitutes `$__rate_interval` (and the other interval macros) with `1m`, and the `$namespace` and
`$model` variables with `.*` (their "All" value). Skips when the `prometheus` binary is missing
outside CI; `make test` installs it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deploy_support as ds
import pytest
import yaml
from prometheus_client import generate_latest

from services.metrics import METRIC_SPECS, Metrics

MODEL = "SmolLM2-135M-Instruct"
GATEWAY_PODS = ("dspark-gateway-0", "dspark-gateway-1")

# Per tick (50 ms), which role each series carries, as docs/metrics.md describes the gateway's
# /metrics: request latencies as the client sees them (role="gateway"), each request's phases
# labelled with the worker role that ran them, and the workers' engine statistics re-exported
# with their role. Token counts come both from the gateway and from the engines.
HISTOGRAMS: dict[str, tuple[str, float]] = {
    "dspark_time_to_first_token_seconds": ("gateway", 3.0),  # > 2 s TTFT target
    "dspark_time_per_output_token_seconds": ("gateway", 0.2),  # > 0.1 s TPOT target
    "dspark_inter_token_latency_seconds": ("gateway", 0.05),
    "dspark_e2e_request_latency_seconds": ("gateway", 12.0),
    "dspark_request_queue_time_seconds": ("prefill", 0.8),
    "dspark_request_prefill_time_seconds": ("prefill", 0.4),
    "dspark_kv_transfer_time_seconds": ("decode", 0.02),
    "dspark_request_decode_time_seconds": ("decode", 10.0),
    "dspark_spec_accept_length": ("decode", 4.0),
}
COUNTERS: dict[str, dict[str, float]] = {
    "dspark_prompt_tokens_total": {"gateway": 500, "prefill": 300},
    "dspark_generation_tokens_total": {"gateway": 64, "prefill": 1, "decode": 63},
    "dspark_prefix_cache_hits_total": {"prefill": 200},
    "dspark_prefix_cache_queries_total": {"prefill": 500},
    "dspark_spec_draft_tokens_total": {"decode": 56},
    "dspark_spec_accepted_tokens_total": {"decode": 40},
    "dspark_spec_undrafted_tokens_total": {"decode": 6},
}
REQUESTS_BY_STATUS = {"200": 8, "429": 1, "500": 1}  # 10 % server errors > 2 % target
GAUGES: dict[str, dict[str, float]] = {
    "dspark_num_requests_running": {"prefill": 3, "decode": 7},
    "dspark_num_requests_waiting": {"gateway": 50, "prefill": 5, "decode": 2},  # 2 pods x 50 > 64
    "dspark_kv_cache_usage_ratio": {"prefill": 0.6, "decode": 0.97},  # > 0.95
}


MIGRATIONS = "dspark_request_migrations_total"
MIGRATIONS_BY_REASON = {"worker_down": 1, "drain": 1}


class SampleTraffic:
    """Records into every metric of a `Metrics` every 50 ms until stopped."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        for name, by_role in GAUGES.items():
            for role, value in by_role.items():
                self.metrics.gauge(name).labels(model=MODEL, role=role).set(value)

    def recorded_names(self) -> set[str]:
        return set(HISTOGRAMS) | set(COUNTERS) | set(GAUGES) | {"dspark_requests_total", MIGRATIONS}

    def tick(self) -> None:
        for name, (role, value) in HISTOGRAMS.items():
            self.metrics.histogram(name).labels(model=MODEL, role=role).observe(value)
        for name, by_role in COUNTERS.items():
            for role, amount in by_role.items():
                self.metrics.counter(name).labels(model=MODEL, role=role).inc(amount)
        for status, count in REQUESTS_BY_STATUS.items():
            self.metrics.counter("dspark_requests_total").labels(model=MODEL, role="gateway", status=status).inc(count)
        for reason, count in MIGRATIONS_BY_REASON.items():
            self.metrics.counter(MIGRATIONS).labels(model=MODEL, role="gateway", reason=reason).inc(count)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.tick()

    def __enter__(self) -> SampleTraffic:
        self.tick()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def eventually(check: Callable[[], Any], timeout_s: float = 20) -> Any:
    """check()'s first truthy result, retried while Prometheus catches up."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.25)


def fast_rules(tmp_path: Path) -> Path:
    rules = ds.load_rules()
    for group in rules["groups"]:
        group["interval"] = "1s"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest.fixture(scope="module")
def live(prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ds.LivePrometheus]:
    workdir = tmp_path_factory.mktemp("prometheus")
    with SampleTraffic() as traffic:
        servers = [ds.serve_metrics(lambda: generate_latest(traffic.metrics.registry)) for _ in GATEWAY_PODS]
        # Target labels as the Prometheus operator sets them for a ServiceMonitor's pods.
        targets = [
            (port, {"namespace": ds.NAMESPACE, "pod": pod})
            for (_, port), pod in zip(servers, GATEWAY_PODS, strict=True)
        ]
        try:
            with ds.LivePrometheus(targets, [fast_rules(workdir)], workdir) as prometheus:
                prometheus.wait_for_samples("dspark_requests_total", samples=3)
                prometheus.wait_for_rule_evaluations()
                yield prometheus
        finally:
            for server, _ in servers:
                server.shutdown()


def test_sample_traffic_covers_every_metric() -> None:
    assert SampleTraffic().recorded_names() == {s.name for s in METRIC_SPECS}


def test_prometheus_scrapes_both_gateway_pods(live: ds.LivePrometheus) -> None:
    up = live.query('up{job="dspark-serve"}')
    assert sorted(r["metric"]["pod"] for r in up if r["value"][1] == "1") == sorted(GATEWAY_PODS)


@pytest.mark.parametrize("query", ds.panel_queries(), ids=lambda q: f"{q.dashboard}:{q.panel}:{q.expr[:40]}")
def test_dashboard_query_returns_data(live: ds.LivePrometheus, query: ds.PanelQuery) -> None:
    promql = ds.grafana_to_promql(query.expr)
    result = eventually(lambda: ds.finite_values(live.query(promql)))
    assert result, f"no finite series for {promql}"


@pytest.mark.parametrize("variable", ds.variable_queries(), ids=lambda v: f"{v[0]}:{v[1]}")
def test_template_variable_resolves(live: ds.LivePrometheus, variable: tuple[str, str, str]) -> None:
    selector, label = ds.parse_label_values(variable[2])
    match = ds.grafana_to_promql(selector) if selector else None
    values = live.label_values(label, match)
    assert values == {"namespace": [ds.NAMESPACE], "model": [MODEL]}[label]


def test_every_rule_is_healthy(live: ds.LivePrometheus) -> None:
    rules = live.rules()
    assert len(rules) == sum(1 for _ in ds.rules_of(ds.load_rules()["groups"]))
    broken = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not broken


@pytest.mark.parametrize(
    "rule", list(ds.rules_of(ds.load_rules()["groups"])), ids=lambda r: r.get("record") or r.get("alert")
)
def test_rule_expression_returns_data(live: ds.LivePrometheus, rule: dict[str, Any]) -> None:
    result = eventually(lambda: live.query(rule["expr"]))
    assert result, f"no series for {rule.get('record') or rule.get('alert')}: {rule['expr']}"


def test_every_alert_is_pending_or_firing(live: ds.LivePrometheus) -> None:
    def states() -> dict[str, str]:
        return {r["name"]: r["state"] for r in live.rules() if r["type"] == "alerting"}

    active = eventually(lambda: all(s in {"pending", "firing"} for s in states().values()) and states())
    assert active, states()


def _finite_result(live: ds.LivePrometheus, query: str) -> list[float]:
    return ds.finite_values(live.query(query))


def test_keda_trigger_queries_return_data(live: ds.LivePrometheus) -> None:
    docs = ds.render({"keda": {"enabled": True}, "gateway": {"autoscaling": {"enabled": False}}})
    for trigger in ds.one(docs, "ScaledObject")["spec"]["triggers"]:
        query: str = trigger["metadata"]["query"]
        assert eventually(functools.partial(_finite_result, live, query)), query


def _panel_values(live: ds.LivePrometheus, title: str, by: str = "role") -> dict[str, float]:
    (panel,) = [q for q in ds.panel_queries() if q.panel == title and q.expr.startswith("sum by (role) (max")]
    result = eventually(lambda: live.query(ds.grafana_to_promql(panel.expr)))
    return {r["metric"][by]: float(r["value"][1]) for r in result}


def test_worker_series_are_counted_once(live: ds.LivePrometheus) -> None:
    # Each gateway pod exports the same worker gauges: the copies are there...
    assert float(live.query('sum(dspark_num_requests_running{role="decode"})')[0]["value"][1]) == 14
    # ...and the dashboard and the rules count them once, while summing the gateway pods' own.
    assert _panel_values(live, "Running requests per role") == {"prefill": 3, "decode": 7}
    waiting = eventually(lambda: live.query("namespace_model_role:dspark_num_requests_waiting:sum"))
    by_role = {r["metric"]["role"]: float(r["value"][1]) for r in waiting}
    assert by_role == {"gateway": 100, "prefill": 5, "decode": 2}


def test_recorded_ratios(live: ds.LivePrometheus) -> None:
    def value(record: str) -> float:
        result = eventually(lambda: live.query(record))
        return float(result[0]["value"][1])

    assert value("namespace_model:dspark_request_errors:ratio_rate5m") == pytest.approx(0.1, rel=0.05)
    assert value("namespace_model:dspark_spec_acceptance:ratio_rate5m") == pytest.approx(40 / 56, rel=0.05)
    assert value("namespace_model:dspark_prefix_cache_hit:ratio_rate5m") == pytest.approx(0.4, rel=0.05)
    assert 2 < value("namespace_model:dspark_time_to_first_token_seconds:p95_5m") <= 3
