"""The workers' own view of their load, read from their Ray actors (`WorkerDirectory`).

The planner runs outside the Ray cluster and joins it as a Ray Client (`ray://<head>:10001`).
It finds the worker actors by name (`<deployment>-<role>-<index>`, as the gateway does), asks
each for its info (the pod it runs on: `WorkerInfo.host`) and its stats (`num_held`,
`draining`), and sums them per pod. Drain calls `drain()` on every worker of the pod.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from services.planner.drain import PodLoad, WorkerDirectoryError
from services.planner.policy import Role


class RayWorkerDirectory:
    def __init__(self, address: str, namespace: str, deployment: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self.namespace = namespace
        self.deployment = deployment
        self.timeout_s = timeout_s

    def _workers(self, role: Role) -> list[tuple[Any, str, Any]]:
        """(handle, pod, stats) of every live worker of `role`."""
        import ray

        from services.workers.deploy import list_workers

        try:
            if not ray.is_initialized():
                ray.init(address=self.address, namespace=self.namespace, logging_level=logging.WARNING)
            names = sorted(name for name, r in list_workers(self.deployment).items() if r == role)
            handles = [ray.get_actor(name) for name in names]
            infos: list[Any] = ray.get([h.info.remote() for h in handles], timeout=self.timeout_s)
            stats: list[Any] = ray.get([h.stats.remote() for h in handles], timeout=self.timeout_s)
        except Exception as exc:  # connection, lookup, timeout or a worker's own failure
            raise WorkerDirectoryError(f"cannot read the {role} workers through {self.address}: {exc}") from exc
        return [(h, info.host, s) for h, info, s in zip(handles, infos, stats, strict=True)]

    def loads(self, role: Role) -> list[PodLoad]:
        held: dict[str, int] = {}
        draining: dict[str, bool] = {}
        for _, pod, stats in self._workers(role):
            held[pod] = held.get(pod, 0) + stats.num_held
            draining[pod] = draining.get(pod, False) or stats.draining
        return [PodLoad(pod, held[pod], draining[pod]) for pod in sorted(held)]

    def drain(self, role: Role, pods: Sequence[str]) -> None:
        import ray

        handles = [h for h, pod, _ in self._workers(role) if pod in pods]
        try:
            ray.get([h.drain.remote() for h in handles], timeout=self.timeout_s)
        except Exception as exc:
            raise WorkerDirectoryError(f"cannot drain {', '.join(pods)}: {exc}") from exc
