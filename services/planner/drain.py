"""Scale-downs that remove idle, drained workers, never random ones.

A decrease of a group goes in two steps, at least one evaluation apart:

1. Victims: the group's pods with the fewest requests held, as their workers report them
   (`WorkerDirectory.loads`: each worker actor's own stats, summed per pod; pods already
   draining first). They are drained: their workers take no new requests, every gateway stops
   routing to them, and they finish what they hold.
2. Once every victim holds nothing (or `drain_timeout_s` has passed), the group's replicas go
   down by the number of victims and the victims are named in `workersToDelete`, so KubeRay
   deletes exactly them.

A drain that has begun always ends in removal: a drained worker takes no traffic again, so if
load returns the policy scales the group up afterwards. While a group drains, further
decreases of it wait; increases go through. Drains live in the planner's memory; the first
evaluation of a planner process takes over the pods it finds draining (a previous process, or
the previous `--once` run, began them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.planner.kube import RayClusterScaler, ReplicaChange
from services.planner.policy import Role

log = logging.getLogger(__name__)


class WorkerDirectoryError(RuntimeError):
    """The workers could not be read or drained: the planner holds and tries again."""


@dataclass(frozen=True)
class PodLoad:
    pod: str
    held: int  # requests its workers hold, in any state
    draining: bool


class WorkerDirectory(Protocol):
    def loads(self, role: Role) -> list[PodLoad]:
        """Every pod running workers of `role`."""
        ...

    def drain(self, role: Role, pods: Sequence[str]) -> None:
        """Drain every worker of `role` on `pods`."""
        ...


@dataclass(frozen=True)
class Drain:
    victims: tuple[str, ...]
    started_s: float
    reason: str


def choose_victims(loads: Sequence[PodLoad], count: int) -> tuple[str, ...]:
    ranked = sorted(loads, key=lambda p: (not p.draining, p.held, p.pod))
    return tuple(p.pod for p in ranked[:count])


class Downscaler:
    """Holds the drains in progress between evaluations."""

    def __init__(self, directory: WorkerDirectory, drain_timeout_s: float = 600.0) -> None:
        self.directory = directory
        self.drain_timeout_s = drain_timeout_s
        self.pending: dict[Role, Drain] = {}
        self._adopted = False

    def begin(self, role: Role, count: int, reason: str, now_s: float) -> str:
        """Drain `count` pods of `role` (unless the role drains already); what was done."""
        if role in self.pending:
            return f"{role}: waiting for {', '.join(self.pending[role].victims)} to drain"
        victims = choose_victims(self.directory.loads(role), count)
        if not victims:
            return f"{role}: no worker pods found to drain"
        self.directory.drain(role, victims)
        self.pending[role] = Drain(victims, now_s, reason)
        return f"{role}: draining {', '.join(victims)} ({reason})"

    def finish(self, scaler: RayClusterScaler, groups: dict[Role, str], now_s: float) -> list[str]:
        """Remove the victims of every drain that is done; what was done or is awaited."""
        notes: list[str] = []
        if not self._adopted:
            for role in groups:
                draining = tuple(p.pod for p in self.directory.loads(role) if p.draining)
                if draining and role not in self.pending:
                    self.pending[role] = Drain(draining, now_s, "drained before this planner started")
            self._adopted = True
        for role, drain in list(self.pending.items()):
            held = {p.pod: p.held for p in self.directory.loads(role)}
            # a victim that is gone already must not count: KubeRay would delete another pod for it
            present = tuple(pod for pod in drain.victims if pod in held)
            busy = {pod: held[pod] for pod in present if held[pod] > 0}
            timed_out = now_s - drain.started_s >= self.drain_timeout_s
            if busy and not timed_out:
                notes.append(f"{role}: draining, {sum(busy.values())} requests left on {', '.join(busy)}")
                continue
            name = groups[role]
            current = scaler.worker_groups((name,))[name].replicas
            why = f"{drain.reason}; drain timed out with {sum(busy.values())} requests left" if busy else drain.reason
            if present:
                scaler.set_replicas({name: ReplicaChange(max(current - len(present), 0), why, present)})
            del self.pending[role]
            notes.append(f"{role}: removed {', '.join(present) or 'nothing (the victims are gone)'}")
        return notes
