"""One planner evaluation: read the signals, decide, resize the RayCluster's worker groups."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.planner.drain import Downscaler, WorkerDirectoryError
from services.planner.kube import RayClusterScaler, ReplicaChange
from services.planner.policy import ROLES, Plan, PlannerState, PolicyConfig, Role, Signals, decide
from services.planner.prometheus import PrometheusReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupNames:
    prefill: str = "prefill"
    decode: str = "decode"

    def of(self, role: Role) -> str:
        return self.prefill if role == "prefill" else self.decode


def evaluate(
    config: PolicyConfig,
    reader: PrometheusReader,
    scaler: RayClusterScaler,
    groups: GroupNames,
    state: PlannerState,
    now_s: float,
    *,
    downscaler: Downscaler | None = None,
    dry_run: bool = False,
) -> tuple[Plan, PlannerState]:
    """Increases are patched at once; a decrease drains its victims first and removes them at a
    later evaluation (services/planner/drain.py). Without a `downscaler` (no way to reach the
    workers) decreases are held: KubeRay would delete random, busy pods.

    Raises PrometheusError or RayClusterError when a side cannot be reached; the caller holds
    and tries again at the next interval. Workers that cannot be reached hold only decreases."""
    if downscaler is not None and not dry_run:
        try:
            for note in downscaler.finish(scaler, {role: groups.of(role) for role in ROLES}, now_s):
                log.info("%s", note)
        except WorkerDirectoryError as exc:
            log.warning("decreases held: %s", exc)
    signals: Signals = reader.read()
    current = scaler.worker_groups((groups.prefill, groups.decode))
    replicas: dict[Role, int] = {
        "prefill": current[groups.prefill].replicas,
        "decode": current[groups.decode].replicas,
    }
    plan, next_state = decide(config, signals, replicas, now_s, state)
    for decision in plan.decisions():
        log.info("%s%s", "[dry run] " if dry_run and decision.changed else "", decision)
    if dry_run:
        # The state carries on as if the plan had been applied, so the log shows the
        # cool-downs the real planner would observe.
        return plan, next_state
    ups = {groups.of(d.role): ReplicaChange(d.target, d.reason) for d in plan.decisions() if d.target > d.current}
    if ups:
        scaler.set_replicas(ups)
    for decision in plan.decisions():
        if decision.target < decision.current:
            if downscaler is None:
                log.warning("%s: decrease held: the planner cannot reach the workers to drain them", decision.role)
            else:
                count = decision.current - decision.target
                try:
                    log.info("%s", downscaler.begin(decision.role, count, decision.reason, now_s))
                except WorkerDirectoryError as exc:
                    log.warning("%s: decrease held: %s", decision.role, exc)
    return plan, next_state
