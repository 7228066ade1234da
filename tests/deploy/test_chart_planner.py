"""The planner as the chart deploys it: it reads only its release's series."""

from __future__ import annotations

from typing import Any

import deploy_support as ds

from services.cli import build_parser
from services.planner.prometheus import SignalQueries


def planner_env(values: dict[str, Any] | None = None) -> dict[str, Any]:
    planner = ds.one(ds.render(values), "Deployment", "-planner")["spec"]["template"]["spec"]
    return ds.env_of(planner["containers"][0])


def queries_from(env: dict[str, Any]) -> list[str]:
    """Every query the planner issues, from the options the chart's variables give it."""
    environ = {k: v for k, v in env.items() if isinstance(v, str)}
    args = build_parser(environ).parse_args(["planner"])
    queries = SignalQueries(model=args.model, selector=args.metrics_selector, window=args.window)
    return [
        queries.latency_p95("dspark_time_to_first_token_seconds"),
        queries.latency_p95("dspark_time_per_output_token_seconds"),
        *(queries.waiting(role) for role in ("prefill", "decode")),
        *(queries.kv_usage(role) for role in ("prefill", "decode")),
    ]


def test_planner_reads_only_its_release() -> None:
    env = planner_env()
    gateway = ds.one(ds.render(), "Service", "-gateway")["metadata"]["name"]
    selector = f'namespace="{ds.NAMESPACE}",service="{gateway}"'
    assert env["DSPARK_METRICS_SELECTOR"] == selector
    for query in queries_from(env):
        assert query.count(selector) == 1, query


def test_metrics_selector_override() -> None:
    env = planner_env({"planner": {"metricsSelector": 'cluster="eu-1",job="dspark"'}})
    assert env["DSPARK_METRICS_SELECTOR"] == 'cluster="eu-1",job="dspark"'
    assert all('cluster="eu-1",job="dspark"' in q for q in queries_from(env))


def test_planner_reaches_the_workers_to_drain_them() -> None:
    docs = ds.render({"rayCluster": {"authToken": {"existingSecret": "ray-token"}}})
    planner = ds.one(docs, "Deployment", "-planner")["spec"]["template"]["spec"]["containers"][0]
    env = ds.env_of(planner)
    cluster = ds.one(docs, "RayCluster")["metadata"]["name"]
    assert env["DSPARK_RAY_ADDRESS"] == f"ray://{cluster}-head-svc:10001"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"]["secretKeyRef"]["name"] == "ray-token"
    args = build_parser({"DSPARK_RAY_ADDRESS": env["DSPARK_RAY_ADDRESS"]}).parse_args(["planner"])
    assert args.ray_address == env["DSPARK_RAY_ADDRESS"]
