"""Render the chart for a profile (helm_python, as the deployment tests do) and extract each pod's
container: command, arguments, env, probes, mounts. Nothing here is retyped from the templates."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "dspark-serve"
RELEASE = "dspark"
NAMESPACE = "dspark-dev"
OVERWRITE_CMD_ANNOTATION = "ray.io/overwrite-container-cmd"
PROBE_KINDS = ("startup", "readiness", "liveness")


@dataclass(frozen=True)
class Probe:
    """One probe of a container: an exec command or an HTTP GET, with its timings."""

    kind: str  # "exec" or "http"
    command: tuple[str, ...]
    path: str
    port: int
    period_s: int
    timeout_s: int
    failure_threshold: int


@dataclass(frozen=True)
class Mount:
    """A volume mount of the container, with the pod's volume it refers to."""

    name: str
    path: str
    read_only: bool
    volume: dict[str, Any]


@dataclass(frozen=True)
class PodPlan:
    """Everything the smoke needs to start one pod's main container as the kubelet would."""

    role: str  # head, prefill, decode, gateway
    node_type: str  # KubeRay node type: head, worker; "" for the gateway (a Deployment)
    group: str  # KubeRay group label (headgroup, prefill, decode); the Deployment for the gateway
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, Any], ...]  # (name, value) or (name, {"valueFrom": ...})
    probes: dict[str, Probe]
    mounts: tuple[Mount, ...]
    ports: dict[str, int]
    resources: dict[str, Any]
    ray_start_params: dict[str, str]
    run_as: tuple[int, int]
    restart_policy: str
    termination_grace_s: int


@dataclass(frozen=True)
class Release:
    """The rendered release as far as the smoke runs it."""

    cluster_name: str
    namespace: str
    overwrite_cmd: bool
    pods: dict[str, PodPlan]
    config_maps: dict[str, dict[str, str]]


def load_values(profile: str) -> dict[str, Any]:
    return yaml.safe_load((CHART_DIR / "profiles" / f"{profile}.yaml").read_text()) or {}


def render(profile: str, *, name: str = RELEASE, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The chart's objects for a profile, as `helm template -f profiles/<profile>.yaml` renders them."""
    import helm_python

    helm_python.disable_logging()  # it logs every symbolic link it follows (the chart's dashboards)
    rendered = helm_python.Chart.load(CHART_DIR).render(load_values(profile), name=name, namespace=namespace)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def _one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    if len(found) != 1:
        raise ValueError(f"expected one {kind} named *{name_suffix}, found {len(found)}")
    return found[0]


def _port_number(port: Any, ports: dict[str, int]) -> int:
    return ports[port] if isinstance(port, str) else int(port)


def parse_probe(spec: dict[str, Any], ports: dict[str, int]) -> Probe:
    timings = (int(spec.get("periodSeconds", 10)), int(spec.get("timeoutSeconds", 1)))
    threshold = int(spec.get("failureThreshold", 3))
    if "exec" in spec:
        return Probe("exec", tuple(spec["exec"]["command"]), "", 0, *timings, threshold)
    if "httpGet" in spec:
        get = spec["httpGet"]
        return Probe("http", (), get.get("path", "/"), _port_number(get["port"], ports), *timings, threshold)
    raise ValueError(f"unsupported probe handler: {sorted(spec)}")


def _env(container: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (e["name"], e["value"] if "value" in e else {"valueFrom": e.get("valueFrom")}) for e in container.get("env", [])
    )


def _mounts(container: dict[str, Any], pod_spec: dict[str, Any]) -> tuple[Mount, ...]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    return tuple(
        Mount(m["name"], m["mountPath"], bool(m.get("readOnly", False)), volumes[m["name"]])
        for m in container.get("volumeMounts", [])
    )


def pod_plan(role: str, node_type: str, group: str, template: dict[str, Any], params: dict[str, str]) -> PodPlan:
    """The plan of a pod template's first (main) container."""
    spec = template["spec"]
    container = spec["containers"][0]
    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}
    security = spec.get("securityContext", {})
    return PodPlan(
        role=role,
        node_type=node_type,
        group=group,
        image=container["image"],
        command=tuple(container.get("command", ())),
        args=tuple(container.get("args", ())),
        env=_env(container),
        probes={k: parse_probe(container[f"{k}Probe"], ports) for k in PROBE_KINDS if f"{k}Probe" in container},
        mounts=_mounts(container, spec),
        ports=ports,
        resources=copy.deepcopy(container.get("resources", {})),
        ray_start_params={k: str(v) for k, v in params.items()},
        run_as=(int(security.get("runAsUser", 0)), int(security.get("runAsGroup", 0))),
        restart_policy=spec.get("restartPolicy", "Always"),
        termination_grace_s=int(spec.get("terminationGracePeriodSeconds", 30)),
    )


def extract(docs: list[dict[str, Any]]) -> Release:
    """The head, worker-group and gateway pods of a rendered release."""
    cluster = _one(docs, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    pods = {"head": pod_plan("head", "head", "headgroup", head["template"], head.get("rayStartParams", {}))}
    for group in cluster["spec"]["workerGroupSpecs"]:
        name = group["groupName"]
        pods[name] = pod_plan(name, "worker", name, group["template"], group.get("rayStartParams", {}))
    gateway = _one(docs, "Deployment", "-gateway")
    pods["gateway"] = pod_plan("gateway", "", gateway["metadata"]["name"], gateway["spec"]["template"], {})
    config_maps = {d["metadata"]["name"]: dict(d.get("data", {})) for d in docs if d["kind"] == "ConfigMap"}
    annotations = cluster["metadata"].get("annotations", {})
    return Release(
        cluster_name=cluster["metadata"]["name"],
        namespace=cluster["metadata"]["namespace"],
        overwrite_cmd=str(annotations.get(OVERWRITE_CMD_ANNOTATION, "")).lower() == "true",
        pods=pods,
        config_maps=config_maps,
    )


def load_release(profile: str = "cpu-dev") -> Release:
    return extract(render(profile))
