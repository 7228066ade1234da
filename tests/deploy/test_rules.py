"""Prometheus rules: promtool checks and unit-tests charts/dspark-serve/files/rules.yaml, the file
the chart's PrometheusRule ships; every alert is tested firing and quiet; names come from code."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import deploy_support as ds
import pytest
import yaml

SLO_ALERTS = {
    "DSparkTTFTP95High": "dspark_time_to_first_token_seconds_bucket",
    "DSparkTPOTP95High": "dspark_time_per_output_token_seconds_bucket",
    "DSparkErrorRateHigh": "dspark_requests_total",
    "DSparkQueueDepthHigh": "dspark_num_requests_waiting",
    "DSparkKVCacheNearlyFull": "dspark_kv_cache_usage_ratio",
}
SLO_TARGETS = {
    "dspark:slo_ttft_p95_seconds": "ttftP95Seconds",
    "dspark:slo_tpot_p95_seconds": "tpotP95Seconds",
    "dspark:slo_error_ratio": "errorRatio",
    "dspark:slo_queue_depth": "queueDepth",
    "dspark:slo_kv_cache_usage_ratio": "kvCacheUsageRatio",
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def rendered_rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return ds.one(ds.render(values), "PrometheusRule")["spec"]["groups"]


def test_promtool_checks_the_rules(promtool: str) -> None:
    result = run(promtool, "check", "rules", str(ds.RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = run(promtool, "test", "rules", str(ds.RULES_TEST_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alerts = {r["alert"] for r in ds.rules_of(ds.load_rules()["groups"]) if "alert" in r}
    assert alerts == set(SLO_ALERTS)
    cases = [
        c for test in yaml.safe_load(ds.RULES_TEST_FILE.read_text())["tests"] for c in test.get("alert_rule_test", [])
    ]
    fired = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert fired == alerts, f"alerts never tested firing: {alerts - fired}"
    assert quiet == alerts, f"alerts never tested quiet: {alerts - quiet}"


def test_unit_tests_would_catch_a_wrong_threshold(promtool: str, tmp_path: Path) -> None:
    """The unit tests are sharp: double the TTFT target and the firing case fails."""
    rules = ds.load_rules()
    for rule in ds.rules_of(rules["groups"]):
        if rule.get("record") == "dspark:slo_ttft_p95_seconds":
            rule["expr"] = "vector(5)"
    broken_rules = tmp_path / "rules.yaml"
    broken_rules.write_text(yaml.safe_dump(rules))
    tests = yaml.safe_load(ds.RULES_TEST_FILE.read_text())
    tests["rule_files"] = [str(broken_rules)]
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    result = run(promtool, "test", "rules", str(test_file))
    assert result.returncode != 0 and "DSparkTTFTP95High" in result.stdout + result.stderr


def test_rules_read_only_metrics_the_code_defines() -> None:
    groups = ds.load_rules()["groups"]
    recorded = {r["record"] for r in ds.rules_of(groups) if "record" in r}
    for rule in ds.rules_of(groups):
        names = ds.series_names_in(rule["expr"])
        unknown = {n for n in names if n not in ds.EXPORTED_SERIES and n not in recorded}
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown series {unknown}"
    for alert, metric in SLO_ALERTS.items():
        assert metric in _inputs_of(alert, groups), f"{alert} does not depend on {metric}"


def _inputs_of(name: str, groups: list[dict[str, Any]]) -> set[str]:
    """Raw series an alert or record depends on, through the recording rules it reads."""
    by_name = {r.get("record") or r.get("alert"): r for r in ds.rules_of(groups)}
    seen: set[str] = set()
    todo = [name]
    while todo:
        for series in ds.series_names_in(by_name[todo.pop()]["expr"]):
            if series not in seen:
                seen.add(series)
                if series in by_name:
                    todo.append(series)
    return seen


def test_chart_ships_the_tested_rules() -> None:
    """With default values the PrometheusRule holds exactly files/rules.yaml."""
    assert rendered_rule_groups() == ds.load_rules()["groups"]


def test_slo_values_change_only_the_target_records(promtool: str, tmp_path: Path) -> None:
    slo = {
        "ttftP95Seconds": 0.75,
        "tpotP95Seconds": 0.04,
        "errorRatio": 0.005,
        "queueDepth": 16,
        "kvCacheUsageRatio": 0.9,
    }
    groups = rendered_rule_groups({"slo": slo})
    shipped = ds.load_rules()["groups"]
    for got, want in zip(ds.rules_of(groups), ds.rules_of(shipped), strict=True):
        if got.get("record") in SLO_TARGETS:
            assert got["expr"] == f"vector({slo[SLO_TARGETS[got['record']]]})"
        else:
            assert got == want
    # The rendered rules are still valid Prometheus rules.
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_slo_values_match_the_rules_file() -> None:
    values = yaml.safe_load((ds.CHART_DIR / "values.yaml").read_text())["slo"]
    targets = {r["record"]: r["expr"] for r in ds.rules_of(ds.load_rules()["groups"]) if r.get("record") in SLO_TARGETS}
    assert targets == {record: f"vector({values[key]})" for record, key in SLO_TARGETS.items()}


@pytest.mark.parametrize("alert", sorted(SLO_ALERTS))
def test_alerts_carry_severity_and_text(alert: str) -> None:
    (rule,) = [r for r in ds.rules_of(ds.load_rules()["groups"]) if r.get("alert") == alert]
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert rule["for"] in {"5m", "10m"}
