"""One planner evaluation: read the signals, decide, patch the RayCluster."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.planner.kube import RayClusterScaler, ReplicaChange
from services.planner.policy import Plan, PlannerState, PolicyConfig, Role, Signals, decide
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
    dry_run: bool = False,
) -> tuple[Plan, PlannerState]:
    """Raises PrometheusError or RayClusterError when a side cannot be reached; the caller
    holds and tries again at the next interval."""
    signals: Signals = reader.read()
    current = scaler.worker_groups((groups.prefill, groups.decode))
    replicas: dict[Role, int] = {
        "prefill": current[groups.prefill].replicas,
        "decode": current[groups.decode].replicas,
    }
    plan, next_state = decide(config, signals, replicas, now_s, state)
    for decision in plan.decisions():
        log.info("%s%s", "[dry run] " if dry_run and decision.changed else "", decision)
    changed = [d for d in plan.decisions() if d.changed]
    if changed and not dry_run:
        scaler.set_replicas({groups.of(d.role): ReplicaChange(d.target, d.reason) for d in changed})
    # A dry run carries the state on as if the plan had been applied, so its log shows the
    # cool-downs the real planner would observe.
    return plan, next_state
