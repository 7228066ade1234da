"""Reads and writes the worker-group replicas of a KubeRay `RayCluster` (ray.io/v1).

RayCluster has no /scale subresource, so the planner patches
`spec.workerGroupSpecs[i].replicas` directly, with a JSON Patch whose `test` operation pins
the index to the group's name: if the list changed since it was read, the patch fails rather
than resizing the wrong group. KubeRay wants minReplicas <= replicas <= maxReplicas, so a bound
the new count would cross moves with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"


class RayClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class WorkerGroup:
    name: str
    index: int  # position in spec.workerGroupSpecs
    replicas: int
    min_replicas: int | None
    max_replicas: int | None


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


class RayClusterScaler:
    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    def _get(self) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name))
        except ApiException as exc:
            raise RayClusterError(
                f"cannot read RayCluster {self.namespace}/{self.name}: {exc.status} {exc.reason}"
            ) from exc

    def worker_groups(self, names: tuple[str, ...]) -> dict[str, WorkerGroup]:
        specs = self._get().get("spec", {}).get("workerGroupSpecs") or []
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
            present = [spec.get("groupName") for spec in specs]
            raise RayClusterError(
                f"RayCluster {self.namespace}/{self.name} has no worker group {missing} (has {present})"
            )
        return found

    def set_replicas(self, targets: Mapping[str, int], reasons: Mapping[str, str] | None = None) -> None:
        """Patch the named groups to their target replicas in one request; a group already
        at its target is left out. Logs each change."""
        from kubernetes.client.exceptions import ApiException

        groups = self.worker_groups(tuple(targets))
        operations: list[dict[str, Any]] = []
        changes: list[str] = []
        for name, target in targets.items():
            group = groups[name]
            if group.replicas == target:
                continue
            path = f"/spec/workerGroupSpecs/{group.index}"
            operations.append({"op": "test", "path": f"{path}/groupName", "value": name})
            operations.append({"op": "replace", "path": f"{path}/replicas", "value": target})
            if group.min_replicas is not None and target < group.min_replicas:
                operations.append({"op": "replace", "path": f"{path}/minReplicas", "value": target})
            if group.max_replicas is not None and target > group.max_replicas:
                operations.append({"op": "replace", "path": f"{path}/maxReplicas", "value": target})
            reason = f" ({reasons[name]})" if reasons and name in reasons else ""
            changes.append(f"{name} {group.replicas} -> {target}{reason}")
        if not operations:
            return
        try:
            self.api.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, operations)
        except ApiException as exc:
            raise RayClusterError(
                f"cannot patch RayCluster {self.namespace}/{self.name}: {exc.status} {exc.reason}"
            ) from exc
        for change in changes:
            log.info("RayCluster %s/%s: %s", self.namespace, self.name, change)
