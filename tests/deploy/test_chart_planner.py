"""The planner as the chart deploys it: it reads only its release's series, reaches the workers
to drain them, and survives `helm upgrade` (live replica counts kept, Ray pods replaced)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import deploy_support as ds
import yaml

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


# --- helm upgrade: live replica counts are kept, Ray pods are replaced ----------------------


def chart_copy(tmp_path: Path, probe: str = "", app_version: str | None = None) -> Any:
    """The chart loaded from a copy, with `probe` as an extra template and another appVersion."""
    import helm_python

    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "chart"
    shutil.copytree(ds.CHART_DIR, root, symlinks=False)
    if probe:
        (root / "templates" / "zz-probe.yaml").write_text(probe)
    if app_version is not None:
        meta = yaml.safe_load((root / "Chart.yaml").read_text())
        meta["appVersion"] = app_version
        (root / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return helm_python.Chart.load(root)


def worker_scale(tmp_path: Path, values: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """`dspark.workerScale` of the decode group against a live group, as the upgrade sees it."""
    probe = (
        '{{- $cfg := include "dspark.workerConfig" (list . "decode") | fromYaml }}\n'
        f"{{{{- $live := {json.dumps(json.dumps(live))} | fromJson }}}}\n"
        'probe: {{ include "dspark.workerScale" (list . $cfg $live) | fromYaml | toJson }}\n'
    )
    rendered = chart_copy(tmp_path, probe).render(values, name=ds.RELEASE, namespace=ds.NAMESPACE)
    return dict(yaml.safe_load(rendered["dspark-serve/templates/zz-probe.yaml"])["probe"])


def test_upgrade_keeps_the_live_replica_count_while_the_planner_owns_it(tmp_path: Path) -> None:
    bounds = {"workers": {"decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4}}}
    pending = {"workersToDelete": ["dspark-decode-worker-x"]}
    assert worker_scale(tmp_path, bounds, {}) == {"replicas": 1}  # install: the values' count
    live = {"groupName": "decode", "replicas": 3, "scaleStrategy": pending}
    assert worker_scale(tmp_path, bounds, live) == {"replicas": 3, "scaleStrategy": pending}
    # Kept within the new bounds (the planner brings it back itself too).
    assert worker_scale(tmp_path, {"workers": {"decode": {"maxReplicas": 2}}}, live)["replicas"] == 2
    # Nobody scales the group: the values say how many.
    fixed = {**bounds, "planner": {"enabled": False}}
    assert worker_scale(tmp_path, fixed, live) == {"replicas": 1}


def rayclusters(chart: Any) -> dict[str, Any]:
    rendered = chart.render({}, name=ds.RELEASE, namespace=ds.NAMESPACE)
    return dict(yaml.safe_load(rendered["dspark-serve/templates/raycluster.yaml"]))


def test_upgrade_replaces_ray_pods_of_another_version(tmp_path: Path) -> None:
    before = ds.one(ds.render(), "RayCluster")
    assert before["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    templates = [before["spec"]["headGroupSpec"]["template"]] + [
        g["template"] for g in before["spec"]["workerGroupSpecs"]
    ]
    versions = {t["metadata"]["annotations"]["dspark.io/version"] for t in templates}
    assert len(versions) == 1
    after = rayclusters(chart_copy(tmp_path, app_version="9.9.9"))
    worker = after["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]["dspark.io/version"]
    assert worker.endswith("-9.9.9") and {worker} != versions
    off = ds.one(ds.render({"rayCluster": {"upgradeStrategy": ""}}), "RayCluster")
    assert "upgradeStrategy" not in off["spec"]


def test_planner_writes_only_what_kuberay_leaves_out_of_its_upgrade_hash() -> None:
    """KubeRay's Recreate compares a hash of the spec without replicas, min/maxReplicas and
    workersToDelete: the planner's writes must not recreate the pods."""
    from services.planner.kube import ReplicaChange, parse_groups, replica_operations

    cluster = ds.one(ds.render(), "RayCluster")
    group = parse_groups(cluster, ("decode",))["decode"]
    for change in (ReplicaChange(0, victims=("pod-a",)), ReplicaChange(group.replicas + 40)):
        for op in replica_operations(group, change):
            assert op["path"].rsplit("/", 1)[1] in {"replicas", "minReplicas", "maxReplicas", "scaleStrategy"}
            if op["path"].endswith("scaleStrategy"):
                assert set(op["value"]) == {"workersToDelete"}
