"""Grafana dashboards: structure, template variables, and metric names from services/metrics.py.
The live check of every query against a real Prometheus is in test_live_prometheus.py."""

from __future__ import annotations

import re
from typing import Any

import deploy_support as ds
import pytest

from services.metrics import METRIC_SPECS

DASHBOARDS = {p.name: ds.load_dashboard(p) for p in ds.dashboard_files()}
QUERIES = ds.panel_queries()


def exprs_of(dashboard: str) -> list[str]:
    return [q.expr for q in QUERIES if q.dashboard == dashboard]


def test_the_two_dashboards_exist() -> None:
    assert set(DASHBOARDS) == {"dspark-serving.json", "dspark-engine.json"}
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_templated_by_datasource_namespace_and_model(name: str) -> None:
    variables = {v["name"]: v for v in DASHBOARDS[name]["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in ("namespace", "model"):
        assert variables[var]["type"] == "query"
        assert variables[var]["includeAll"] and variables[var]["multi"] and variables[var]["allValue"] == ".*"
    # The model list follows the chosen namespace.
    assert "$namespace" in variables["model"]["query"]["query"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_are_well_formed(name: str) -> None:
    dashboard = DASHBOARDS[name]
    ids = [p["id"] for p in ds.panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in ds.panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        assert panel["description"], f"{panel['title']} has no description"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.dashboard}:{q.panel}")
def test_queries_use_only_metrics_the_code_defines(query: ds.PanelQuery) -> None:
    names = ds.series_names_in(query.expr)
    assert names, "a panel query must read at least one dspark metric"
    # No recording rules either: the dashboards work without the PrometheusRule.
    assert names <= ds.EXPORTED_SERIES, f"not exported by services/metrics.py: {names - ds.EXPORTED_SERIES}"


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.dashboard}:{q.panel}")
def test_every_selector_follows_namespace_and_model(query: ds.PanelQuery) -> None:
    for metric, matchers in ds.selectors_in(query.expr):
        assert 'namespace=~"$namespace"' in matchers and 'model=~"$model"' in matchers, (
            f"{metric}{matchers} ignores the namespace/model variables"
        )


def test_variable_queries_use_code_metrics() -> None:
    for dashboard, var, query in ds.variable_queries():
        selector, label = ds.parse_label_values(query)
        assert label in {"namespace", "model"}, (dashboard, var)
        assert selector and ds.series_names_in(selector) <= ds.EXPORTED_SERIES, (dashboard, var)


def test_every_metric_is_on_a_dashboard() -> None:
    used = set().union(*(ds.series_names_in(q.expr) for q in QUERIES))
    for spec in METRIC_SPECS:
        assert any(n.startswith(spec.name) for n in used), f"{spec.name} is on no dashboard"


def _quantiles(exprs: list[str], metric: str) -> set[str]:
    return {q for e in exprs for q in re.findall(rf"histogram_quantile\(([0-9.]+), [^;]*?{metric}_bucket", e)}


@pytest.mark.parametrize(
    "metric",
    [
        "dspark_time_to_first_token_seconds",
        "dspark_time_per_output_token_seconds",
        "dspark_inter_token_latency_seconds",
        "dspark_e2e_request_latency_seconds",
    ],
)
def test_serving_latency_at_p50_p90_p95_p99(metric: str) -> None:
    assert _quantiles(exprs_of("dspark-serving.json"), metric) >= {"0.5", "0.9", "0.95", "0.99"}


@pytest.mark.parametrize(
    "metric",
    [
        "dspark_request_queue_time_seconds",
        "dspark_request_prefill_time_seconds",
        "dspark_kv_transfer_time_seconds",
        "dspark_request_decode_time_seconds",
    ],
)
def test_serving_per_phase_latency(metric: str) -> None:
    assert _quantiles(exprs_of("dspark-serving.json"), metric) >= {"0.5", "0.95"}


def test_serving_traffic_panels() -> None:
    exprs = exprs_of("dspark-serving.json")
    assert any("sum by (status) (rate(dspark_requests_total" in e for e in exprs)
    assert any('status=~"5.."' in e for e in exprs)
    for counter in ("dspark_prompt_tokens_total", "dspark_generation_tokens_total"):
        assert any(counter in e for e in exprs)


def test_engine_panels() -> None:
    titles = {p["title"]: p for p in ds.panels(DASHBOARDS["dspark-engine.json"])}
    expected = {
        "Running requests per role": ["dspark_num_requests_running"],
        "Waiting requests per role": ["dspark_num_requests_waiting"],
        "KV cache usage": ["dspark_kv_cache_usage_ratio"],
        "Prefix-cache hit rate": ["dspark_prefix_cache_hits_total", "dspark_prefix_cache_queries_total"],
        "DSpark acceptance length": ["dspark_spec_accept_length_sum", "dspark_spec_accept_length_bucket"],
        "DSpark acceptance rate": ["dspark_spec_accepted_tokens_total", "dspark_spec_draft_tokens_total"],
        "Drafted, accepted and undrafted tokens / s": [
            "dspark_spec_draft_tokens_total",
            "dspark_spec_accepted_tokens_total",
            "dspark_spec_undrafted_tokens_total",
        ],
        "Decode step time (derived)": ["dspark_num_requests_running", "dspark_spec_accept_length_count"],
    }
    for title, metrics in expected.items():
        exprs = " ".join(t["expr"] for t in titles[title]["targets"])
        assert all(m in exprs for m in metrics), title
        if title != "KV cache usage":
            assert "by (role" in exprs, f"{title} is not per role"


def test_worker_series_are_deduplicated_across_gateway_pods() -> None:
    """Worker gauges and counters reach Prometheus once per gateway pod; sums over them must
    first collapse the copies (see files/rules.yaml). Ratios of two such sums and quantiles are
    unaffected by the copies and are left alone."""
    absolute = (
        "dspark_num_requests_running",
        "dspark_num_requests_waiting",
        "dspark_spec_draft_tokens_total",
        "dspark_spec_accepted_tokens_total",
        "dspark_spec_undrafted_tokens_total",
        "dspark_generation_tokens_total",
        "dspark_prompt_tokens_total",
    )
    checked = 0
    for query in QUERIES:
        if "/" in query.expr:
            continue
        for metric, matchers in ds.selectors_in(query.expr):
            if metric in absolute and 'role!="gateway"' in matchers and "sum" in query.expr:
                assert "max without (instance, pod)" in query.expr, f"{query.panel}: {metric}"
                checked += 1
    assert checked >= 5


def test_chart_ships_the_dashboard_files() -> None:
    configmaps = [d for d in ds.objects(ds.render(), "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    shipped: dict[str, Any] = {}
    for cm in configmaps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped.update(cm["data"])
    assert set(shipped) == set(DASHBOARDS)
    for name, text in shipped.items():
        assert text == (ds.DASHBOARD_DIR / name).read_text().rstrip("\n"), f"{name} differs from dashboards/"
    assert (ds.CHART_DIR / "dashboards").resolve() == ds.DASHBOARD_DIR.resolve()


def test_dashboard_configmap_label_and_namespace_are_configurable() -> None:
    docs = ds.render(
        {
            "monitoring": {
                "dashboards": {
                    "label": "grafana_dashboard_dspark",
                    "labelValue": "yes",
                    "namespace": "grafana",
                }
            }
        }
    )
    for cm in (d for d in ds.objects(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]):
        assert cm["metadata"]["labels"]["grafana_dashboard_dspark"] == "yes"
        assert cm["metadata"]["namespace"] == "grafana"
