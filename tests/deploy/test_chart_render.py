"""The chart renders for every profile, lints clean, and every object it renders is valid.

Core objects are checked by `kubernetes-validate -k 1.33.0 --strict` (Kubernetes 1.33 schemas,
bundled with kubernetes-validate 1.37.0). The custom resources (KubeRay RayCluster, Prometheus
operator ServiceMonitor and PrometheusRule, KEDA ScaledObject) are checked with jsonschema against
CRD schemas vendored under tests/data/crds/: no CRD can be downloaded where the tests run, so
those schemas were written for the fields the chart uses, following the published CRDs'
structure (see tests/data/crds/README.md). Pod templates inside the RayCluster are checked as
core v1 PodTemplates.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import deploy_support as ds
import pytest

# Every optional object on (where two exclude each other, the one that is off by default).
ALL_FEATURES: dict[str, Any] = {
    "gateway": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "tls": [{"secretName": "dspark-tls", "hosts": ["dspark.example.com"]}],
        },
        "autoscaling": {"enabled": False},
        "apiKeys": {"existingSecret": "dspark-api-keys"},
    },
    "keda": {"enabled": True},
    "networkPolicy": {
        "enabled": True,
        "gatewayFrom": [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}],
    },
    "planner": {"enabled": False},
    "rayCluster": {"autoscaler": {"enabled": True}},
}

VARIANTS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "defaults": (None, {}),
    **{profile: (profile, {}) for profile in ds.PROFILES},
    "all-features": (None, ALL_FEATURES),
    "model-from-image": (
        None,
        {"model": {"source": "image", "image": {"reference": "registry.example.com/weights:v1"}}},
    ),
}


def split(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    custom = [d for d in docs if d["kind"] in ds.CRD_KINDS]
    core = [d for d in docs if d["kind"] not in ds.CRD_KINDS]
    return core, custom


def test_profiles_exist() -> None:
    assert set(ds.PROFILES) == {"mi35x-disaggregated", "nvidia", "cpu-dev"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lint_is_clean(variant: str) -> None:
    import helm_python

    profile, extra = VARIANTS[variant]
    values = ds.deep_merge(ds.load_profile(profile) if profile else {}, extra)
    report = helm_python.lint(
        ds.CHART_DIR, values, strict=True, namespace=ds.NAMESPACE, kube_version=f"v{ds.KUBE_VERSION}"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    # Helm only suggests an icon (severity 1, info); anything at warning level or above fails.
    assert not problems, problems


def core_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The core objects, plus those nested in custom resources (pod templates, metadata)."""
    core, custom = split(docs)
    for doc in custom:
        core.extend(ds.embedded_objects(doc))
    return core


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_object_validates(variant: str) -> None:
    profile, extra = VARIANTS[variant]
    docs = ds.render(extra, profile)
    for doc in split(docs)[1]:
        errors = ds.crd_errors(doc)
        assert not errors, f"{doc['kind']}/{doc['metadata']['name']}: {errors}"
    assert not ds.kubernetes_errors(core_objects(docs))


def test_kubernetes_validate_command_passes_every_profile(tmp_path: Path) -> None:
    """The command itself, as CI would run it, over every profile's core objects at once."""
    docs = [d for profile in ds.PROFILES for d in core_objects(ds.render(profile=profile))]
    result = ds.kubernetes_validate_cli(docs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The command only warns (exit 0) about kinds it has no schema for.
    assert "WARN" not in result.stdout + result.stderr


def test_all_features_render_every_kind() -> None:
    kinds = {d["kind"] for d in ds.render(ALL_FEATURES)}
    assert kinds >= {
        "Deployment",
        "Service",
        "Ingress",
        "ScaledObject",
        "NetworkPolicy",
        "RayCluster",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "ServiceAccount",
    }
    kinds = {d["kind"] for d in ds.render()}
    assert kinds >= {"HorizontalPodAutoscaler", "Role", "RoleBinding"}


def test_validators_reject_broken_objects(tmp_path: Path, default_docs: list[dict[str, Any]]) -> None:
    """The checks above are live: a misspelt field or a wrong type fails them."""
    deployment = copy.deepcopy(ds.one(default_docs, "Deployment", "-gateway"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    assert ds.kubernetes_errors([deployment])
    assert ds.kubernetes_validate_cli([deployment], tmp_path).returncode != 0
    assert ds.kubernetes_errors([{**deployment, "apiVersion": "apps/v2"}])

    raycluster = copy.deepcopy(ds.one(default_docs, "RayCluster"))
    raycluster["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    assert ds.crd_errors(raycluster)
    raycluster = copy.deepcopy(ds.one(default_docs, "RayCluster"))
    raycluster["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 8
    assert ds.crd_errors(raycluster)
    pod_template = ds.embedded_objects(raycluster)[1]
    pod_template["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "gcs"
    assert ds.kubernetes_errors([pod_template])

    rule = copy.deepcopy(ds.one(default_docs, "PrometheusRule"))
    rule["spec"]["groups"][1]["rules"][-1]["for"] = "ten minutes"
    assert ds.crd_errors(rule)

    scaled = ds.one(ds.render(ALL_FEATURES), "ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 50
    assert ds.crd_errors(scaled)


def test_notes_render_for_every_profile() -> None:
    for profile in (None, *ds.PROFILES):
        notes = next(t for p, t in ds.render_files(profile=profile).items() if p.endswith("NOTES.txt"))
        assert "kubectl -n llm get raycluster dspark-dspark-serve" in notes
        assert "prefill:" in notes and "decode:" in notes
