"""What the KubeRay operator does to a RayCluster's pods, emulated for the smoke: the `ray start`
command it generates (KUBERAY_GEN_RAY_START_CMD) and the env it adds. The rules follow
ray-operator/controllers/ray/common/pod.go (setMissingRayStartParams, generateRayStartCommand,
convertParamMap, setContainerEnvVars) of ray-project/kuberay; this is an independent rewrite."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

DEFAULT_HEAD_PORT = "6379"
DEFAULT_METRICS_PORT = 8080
DEFAULT_DASHBOARD_AGENT_LISTEN_PORT = 52365
CLUSTER_DOMAIN = "cluster.local"
KUBERAY_VERSION = "nightly"
LOCAL_HOST = "127.0.0.1"
# `ray start` flags that take an explicit true/false rather than being switches.
_EXPLICIT_BOOLEAN_FLAGS = ("log-color", "include-dashboard", "include-log-monitor")
# IsGPUResourceKey: names ending in "gpu" (nvidia.com/gpu, amd.com/gpu) or NVIDIA MIG slices.
_GPU_RESOURCE = re.compile(r"gpu$|^nvidia\.com/mig-\d+g\.\d+gb$")

_SUFFIXES = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|)$")


def quantity_value(quantity: Any) -> int:
    """Kubernetes resource.Quantity.Value(): the quantity as an integer, rounded up (250m -> 1)."""
    match = _QUANTITY.match(str(quantity).strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    value = Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)])
    return math.ceil(value)


def head_port(head_params: dict[str, str]) -> str:
    """GetHeadPort: the head's `port` parameter, else 6379."""
    return head_params.get("port", DEFAULT_HEAD_PORT)


def head_service_name(cluster_name: str) -> str:
    return f"{cluster_name}-head-svc"


def fqdn_head_service(cluster_name: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> str:
    return f"{head_service_name(cluster_name)}.{namespace}.svc.{domain}"


def set_missing_ray_start_params(params: dict[str, str], node_type: str, port: str, fqdn: str) -> dict[str, str]:
    """setMissingRayStartParams: address (workers), dashboard-host (head), metrics port, block, agent port."""
    out = dict(params)
    if node_type == "worker":
        out.setdefault("address", f"{fqdn}:{port}")
    if node_type == "head":
        out.setdefault("dashboard-host", "0.0.0.0")
    out.setdefault("metrics-export-port", str(DEFAULT_METRICS_PORT))
    out["block"] = "true"
    out.setdefault("dashboard-agent-listen-port", str(DEFAULT_DASHBOARD_AGENT_LISTEN_PORT))
    return out


def _resource_params(params: dict[str, str], resources: dict[str, Any]) -> dict[str, str]:
    """num-cpus (limit, else request), memory (limit), num-gpus (first GPU limit, sorted)."""
    out = dict(params)
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if "num-cpus" not in out:
        for source in (limits, requests):
            if source.get("cpu") is not None and quantity_value(source["cpu"]) != 0:
                out["num-cpus"] = str(quantity_value(source["cpu"]))
                break
    if "memory" not in out and limits.get("memory") is not None and quantity_value(limits["memory"]) != 0:
        out["memory"] = str(quantity_value(limits["memory"]))
    if "num-gpus" not in out:
        for key in sorted(limits):
            if _GPU_RESOURCE.search(key) and quantity_value(limits[key]) != 0:
                out["num-gpus"] = str(quantity_value(limits[key]))
                break
    return out


def convert_param_map(params: dict[str, str]) -> str:
    """convertParamMap: sorted ` --key=value ` flags; "true" becomes a bare switch, "false" is dropped."""
    flags = []
    for key in sorted(params):
        value = params[key]
        if value.lower() in ("true", "false") and key not in _EXPLICIT_BOOLEAN_FLAGS:
            if value.lower() == "true":
                flags.append(f" --{key} ")
        else:
            flags.append(f" --{key}={value} ")
    return "".join(flags)


def generate_ray_start_command(node_type: str, params: dict[str, str], resources: dict[str, Any]) -> str:
    """generateRayStartCommand, applied to the parameters setMissingRayStartParams completed."""
    complete = _resource_params(params, resources)
    head = "--head " if node_type == "head" else ""
    return f"ray start {head}{convert_param_map(complete)}"


def ray_start_command(node_type: str, params: dict[str, str], resources: dict[str, Any], port: str, fqdn: str) -> str:
    """The value of KUBERAY_GEN_RAY_START_CMD for a head or worker pod."""
    return generate_ray_start_command(node_type, set_missing_ray_start_params(params, node_type, port, fqdn), resources)


def operator_env(
    *,
    node_type: str,
    existing: set[str],
    fqdn: str,
    port: str,
    start_cmd: str,
    cluster_name: str,
    namespace: str,
    pod_name: str,
    group: str,
) -> list[tuple[str, str]]:
    """setContainerEnvVars for a RayCluster pod (no default envs configured, CRD RayCluster), in
    KubeRay's order, its fieldRefs resolved as the kubelet would."""
    ip = LOCAL_HOST if node_type == "head" else fqdn
    env: list[tuple[str, str]] = []
    if node_type == "worker":
        env += [("FQ_RAY_IP", ip), ("RAY_IP", ip.split(".")[0])]
    env += [
        ("RAY_CLUSTER_NAME", cluster_name),  # fieldRef metadata.labels['ray.io/cluster']
        ("RAY_CLUSTER_NAMESPACE", namespace),  # fieldRef metadata.namespace
        ("RAY_CLOUD_INSTANCE_ID", pod_name),  # fieldRef metadata.name
        ("RAY_NODE_TYPE_NAME", group),  # fieldRef metadata.labels['ray.io/group']
        ("KUBERAY_GEN_RAY_START_CMD", start_cmd),
    ]
    names = existing | {name for name, _ in env}
    optional = [
        ("RAY_PORT", port),
        ("RAY_ADDRESS", f"{ip}:{port}"),
        ("RAY_USAGE_STATS_KUBERAY_IN_USE", "1"),
    ]
    env += [(name, value) for name, value in optional if name not in names]
    if node_type == "head":
        env.append(("RAY_USAGE_STATS_EXTRA_TAGS", f"kuberay_version={KUBERAY_VERSION};kuberay_crd=RayCluster"))
    if "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE" not in names:
        env.append(("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "1"))
    return env


def pod_name(cluster_name: str, node_type: str, group: str, suffix: str) -> str:
    """The name KubeRay gives a pod (generateName plus the API server's random suffix)."""
    if node_type == "head":
        return f"{cluster_name}-head-{suffix}"
    return f"{cluster_name}-{group}-worker-{suffix}"
