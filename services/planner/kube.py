"""Reads and writes the worker groups of a KubeRay `RayCluster` (ray.io/v1).

RayCluster has no /scale subresource, so the planner patches `spec.workerGroupSpecs[i]`
directly with a JSON Patch, sent as `application/json-patch+json` (the client would otherwise
label a list body as a merge patch, which the API server refuses). Each write is conditional
on the `metadata.resourceVersion` it was computed from: the patch replaces the version with
the one read, so if the object changed since, the server answers 409 Conflict (a JSON Patch
`test` would fail with 422 instead); the scaler then reads again and recomputes, a bounded
number of times. KubeRay wants minReplicas <= replicas <= maxReplicas, so a bound the new
count would cross moves with it.

A decrease names the pods to remove in `scaleStrategy.workersToDelete`: without it, KubeRay
(in-tree autoscaling off) deletes random pods of the group. An increase clears the list.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
JSON_PATCH = "application/json-patch+json"
CONFLICT = 409


class RayClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class WorkerGroup:
    name: str
    index: int  # position in spec.workerGroupSpecs
    replicas: int
    min_replicas: int | None
    max_replicas: int | None


@dataclass(frozen=True)
class ReplicaChange:
    """One group's new size; `victims` are the pod names a decrease removes (they must have
    been drained first)."""

    target: int
    reason: str = ""
    victims: tuple[str, ...] = ()


def custom_objects_api(host: str | None = None) -> Any:
    """A CustomObjectsApi: against `host` when given (no credentials), else in-cluster
    config, else the local kubeconfig."""
    from kubernetes import client, config

    if host:
        configuration = client.Configuration()
        configuration.host = host.rstrip("/")
        return client.CustomObjectsApi(client.ApiClient(configuration))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CustomObjectsApi()


def parse_groups(cluster: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, WorkerGroup]:
    specs = cluster.get("spec", {}).get("workerGroupSpecs") or []
    found: dict[str, WorkerGroup] = {}
    for index, spec in enumerate(specs):
        if spec.get("groupName") in names:
            found[spec["groupName"]] = WorkerGroup(
                name=spec["groupName"],
                index=index,
                replicas=int(spec.get("replicas", spec.get("minReplicas", 0))),
                min_replicas=spec.get("minReplicas"),
                max_replicas=spec.get("maxReplicas"),
            )
    missing = sorted(set(names) - set(found))
    if missing:
        meta = cluster.get("metadata", {})
        present = [spec.get("groupName") for spec in specs]
        raise RayClusterError(
            f"RayCluster {meta.get('namespace')}/{meta.get('name')} has no worker group {missing} (has {present})"
        )
    return found


def replica_operations(group: WorkerGroup, change: ReplicaChange) -> list[dict[str, Any]]:
    """The JSON Patch operations that move `group` to `change.target` (none if it is there)."""
    target = change.target
    if group.replicas == target:
        return []
    path = f"/spec/workerGroupSpecs/{group.index}"
    victims = list(change.victims) if target < group.replicas else []
    # `add` on an object member replaces it, so this works whether scaleStrategy exists or not.
    operations: list[dict[str, Any]] = [
        {"op": "add", "path": f"{path}/scaleStrategy", "value": {"workersToDelete": victims}},
        {"op": "replace", "path": f"{path}/replicas", "value": target},
    ]
    if group.min_replicas is not None and target < group.min_replicas:
        operations.append({"op": "replace", "path": f"{path}/minReplicas", "value": target})
    if group.max_replicas is not None and target > group.max_replicas:
        operations.append({"op": "replace", "path": f"{path}/maxReplicas", "value": target})
    return operations


class RayClusterScaler:
    def __init__(self, api: Any, namespace: str, name: str, *, max_attempts: int = 3) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.max_attempts = max_attempts

    @property
    def ref(self) -> str:
        return f"RayCluster {self.namespace}/{self.name}"

    def _get(self) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name))
        except ApiException as exc:
            raise RayClusterError(f"cannot read {self.ref}: {exc.status} {exc.reason}") from exc

    def worker_groups(self, names: tuple[str, ...]) -> dict[str, WorkerGroup]:
        return parse_groups(self._get(), names)

    def set_replicas(self, changes: Mapping[str, ReplicaChange]) -> None:
        """Patch the named groups to their targets in one conditional request; a group
        already at its target is left out. Retries on 409 Conflict with a fresh read. Logs
        each change."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(1, self.max_attempts + 1):
            cluster = self._get()
            version = cluster.get("metadata", {}).get("resourceVersion")
            if not version:
                raise RayClusterError(f"{self.ref} has no metadata.resourceVersion")
            groups = parse_groups(cluster, tuple(changes))
            operations: list[dict[str, Any]] = []
            for name, change in changes.items():
                operations += replica_operations(groups[name], change)
            if not operations:
                return
            operations.append({"op": "replace", "path": "/metadata/resourceVersion", "value": version})
            try:
                self.api.patch_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.name, operations, _content_type=JSON_PATCH
                )
            except ApiException as exc:
                if exc.status == CONFLICT and attempt < self.max_attempts:
                    log.info("%s changed since it was read (version %s); reading it again", self.ref, version)
                    continue
                raise RayClusterError(f"cannot patch {self.ref}: {exc.status} {exc.reason}") from exc
            for name, change in changes.items():
                if groups[name].replicas != change.target:
                    log.info("%s: %s", self.ref, describe(name, groups[name].replicas, change))
            return


def describe(name: str, current: int, change: ReplicaChange) -> str:
    victims = f", removing {', '.join(change.victims)}" if change.victims and change.target < current else ""
    reason = f" ({change.reason})" if change.reason else ""
    return f"{name} {current} -> {change.target}{reason}{victims}"
