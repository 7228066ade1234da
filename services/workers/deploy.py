"""Creating worker actors and finding them again.

Workers are named actors `<deployment>-<role>-<index>` in a Ray namespace (default
"dspark"). The gateway discovers them by listing that namespace, so replicas started later
(`dspark-serve worker`, an autoscaler) join without restarting the gateway.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from engine.config import EngineConfig
from services.workers.actors import ACTOR_CLASSES
from services.workers.types import ROLES, Role

DEFAULT_NAMESPACE = "dspark"
DEFAULT_DEPLOYMENT = "dspark"


def actor_name(deployment: str, role: Role, index: int) -> str:
    return f"{deployment}-{role}-{index}"


def parse_actor_name(deployment: str, name: str) -> tuple[Role, int] | None:
    match = re.fullmatch(rf"{re.escape(deployment)}-({'|'.join(ROLES)})-(\d+)", name)
    if match is None:
        return None
    return match.group(1), int(match.group(2))  # type: ignore[return-value]


def list_workers(deployment: str = DEFAULT_DEPLOYMENT) -> dict[str, Role]:
    """Live named workers of a deployment in the current namespace: name -> role."""
    found: dict[str, Role] = {}
    for name in ray.util.list_named_actors(all_namespaces=False):
        parsed = parse_actor_name(deployment, name)
        if parsed is not None:
            found[name] = parsed[0]
    return found


@dataclass(frozen=True)
class WorkerOptions:
    kv_transfer: str = "ray"
    consumer_lease_s: float = 30.0
    max_restarts: int = -1  # -1: restart forever
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    torch_threads: int = 0  # 0: leave torch's default
    detached: bool = False  # outlive the process that created it
    pin_to_local_node: bool = False  # place the actors on the node this process runs on


def spawn_workers(
    role: Role,
    replicas: int,
    engine_config: EngineConfig,
    options: WorkerOptions,
    *,
    deployment: str = DEFAULT_DEPLOYMENT,
    namespace: str | None = None,
) -> dict[str, Any]:
    """Create `replicas` named actors of `role`, at the next free indexes. Returns name -> handle
    (the actors load their model in the background; see `wait_ready`). Several processes may
    spawn at once (one per node): an index taken meanwhile is skipped."""
    taken: set[int] = set()
    for name in list_workers(deployment):
        parsed = parse_actor_name(deployment, name)
        if parsed is not None and parsed[0] == role:
            taken.add(parsed[1])
    extra: dict[str, Any] = {"namespace": namespace} if namespace else {}
    if options.detached:
        extra["lifetime"] = "detached"
    if options.pin_to_local_node:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = ray.get_runtime_context().get_node_id()
        extra["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    handles: dict[str, Any] = {}
    index = 0
    while len(handles) < replicas:
        if index not in taken:
            name = actor_name(deployment, role, index)
            actor_options = ACTOR_CLASSES[role].options(
                name=name,
                max_restarts=options.max_restarts,
                max_task_retries=0,
                num_cpus=options.num_cpus,
                num_gpus=options.num_gpus,
                max_concurrency=1000,
                **extra,
            )
            with contextlib.suppress(ValueError):  # the name was taken by a concurrent spawner
                handles[name] = actor_options.remote(
                    engine_config, name, options.kv_transfer, options.consumer_lease_s, options.torch_threads
                )
        index += 1
    return handles


def wait_ready(handles: dict[str, Any], timeout_s: float, on_ready: Callable[[str], None] | None = None) -> None:
    """Block until every actor has loaded its model; raises TimeoutError or the actor's error."""
    pending = {handle.ping.remote(): name for name, handle in handles.items()}
    deadline = time.monotonic() + timeout_s
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"workers not ready after {timeout_s:g} s: {sorted(pending.values())}")
        done, _ = ray.wait(list(pending), num_returns=1, timeout=min(remaining, 1.0))
        for ref in done:
            name = pending.pop(ref)
            ray.get(ref)
            if on_ready is not None:
                on_ready(name)
