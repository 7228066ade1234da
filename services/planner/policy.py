"""Replica decisions for the prefill and decode groups: pure, no I/O, no clock.

Prefill follows TTFT and the prefill queue; decode follows TPOT, the decode queue and the
decode KV usage. Each group moves inside [min, max] with a hysteresis band:

- up when p95 > `scale_up_ratio` x target, or waiting > `queue_per_replica` x replicas, or
  (decode) KV usage > `kv_usage_high`; at most once per `scale_up_cooldown_s`;
- down only when p95 < `scale_down_ratio` x target (or no traffic), nothing waits and KV
  usage < `kv_usage_low`, and that has held at every evaluation for `scale_down_cooldown_s`
  (a change of the group restarts that clock);
- hold in between, and whenever the gauges are missing (no data is not "idle").

The state between evaluations (`PlannerState`) is returned, never mutated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class GroupLimits:
    min_replicas: int
    max_replicas: int

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < max(self.min_replicas, 1):
            raise ValueError(
                f"max_replicas must be >= max(min_replicas, 1), got {self.max_replicas} "
                f"with min_replicas {self.min_replicas}"
            )

    def clamp(self, replicas: int) -> int:
        return min(max(replicas, self.min_replicas), self.max_replicas)


@dataclass(frozen=True)
class PolicyConfig:
    ttft_target_s: float
    tpot_target_s: float
    prefill: GroupLimits = GroupLimits(1, 4)
    decode: GroupLimits = GroupLimits(1, 4)
    scale_up_ratio: float = 1.0  # p95 above ratio x target: scale up
    scale_down_ratio: float = 0.5  # p95 below ratio x target (and idle queue, low KV): scale down
    queue_per_replica: float = 8.0  # waiting requests per replica above which to scale up
    kv_usage_high: float = 0.9  # decode KV usage above which to scale up
    kv_usage_low: float = 0.5  # KV usage below which a scale-down is allowed
    scale_up_step: int = 1  # smallest increase
    scale_down_step: int = 1  # decrease per scale-down
    max_step: int = 4  # largest change of one group in one evaluation
    scale_up_cooldown_s: float = 60.0
    scale_down_cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("ttft_target_s", "tpot_target_s", "queue_per_replica"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.scale_down_ratio < self.scale_up_ratio:
            raise ValueError(
                "need 0 < scale_down_ratio < scale_up_ratio (the hysteresis band), got "
                f"{self.scale_down_ratio} and {self.scale_up_ratio}"
            )
        if not 0 <= self.kv_usage_low < self.kv_usage_high <= 1:
            raise ValueError(
                f"need 0 <= kv_usage_low < kv_usage_high <= 1, got {self.kv_usage_low} and {self.kv_usage_high}"
            )
        if not 1 <= self.scale_up_step <= self.max_step or not 1 <= self.scale_down_step <= self.max_step:
            raise ValueError(
                f"need 1 <= scale_up_step, scale_down_step <= max_step, got {self.scale_up_step}, "
                f"{self.scale_down_step}, {self.max_step}"
            )
        if self.scale_up_cooldown_s < 0 or self.scale_down_cooldown_s < 0:
            raise ValueError("cool-downs must be >= 0")

    def limits(self, role: Role) -> GroupLimits:
        return self.prefill if role == "prefill" else self.decode

    def latency_target_s(self, role: Role) -> float:
        return self.ttft_target_s if role == "prefill" else self.tpot_target_s


@dataclass(frozen=True)
class RoleSignals:
    """What Prometheus says about one role. None: no data (for a p95: no requests in the
    window; for the gauges: no series at all)."""

    latency_p95_s: float | None  # TTFT for prefill, TPOT for decode
    waiting: float | None
    kv_usage: float | None


@dataclass(frozen=True)
class Signals:
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    prefill_waiting: float | None
    decode_waiting: float | None
    prefill_kv_usage: float | None
    decode_kv_usage: float | None

    def role(self, role: Role) -> RoleSignals:
        if role == "prefill":
            return RoleSignals(self.ttft_p95_s, self.prefill_waiting, self.prefill_kv_usage)
        return RoleSignals(self.tpot_p95_s, self.decode_waiting, self.decode_kv_usage)


@dataclass(frozen=True)
class GroupState:
    last_scale_up_s: float | None = None  # clock of the last increase
    calm_since_s: float | None = None  # since when every evaluation allowed a scale-down


@dataclass(frozen=True)
class PlannerState:
    prefill: GroupState = field(default_factory=GroupState)
    decode: GroupState = field(default_factory=GroupState)

    def group(self, role: Role) -> GroupState:
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class Decision:
    role: Role
    current: int
    target: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.target != self.current

    def __str__(self) -> str:
        arrow = f"{self.current} -> {self.target}" if self.changed else f"hold at {self.current}"
        return f"{self.role}: {arrow} ({self.reason})"


@dataclass(frozen=True)
class Plan:
    prefill: Decision
    decode: Decision

    def decisions(self) -> tuple[Decision, Decision]:
        return (self.prefill, self.decode)


def decide(
    config: PolicyConfig,
    signals: Signals,
    replicas: dict[Role, int],
    now_s: float,
    state: PlannerState,
) -> tuple[Plan, PlannerState]:
    """One evaluation: a decision per group and the state for the next one. `now_s` is any
    monotonic clock in seconds (the same one every call)."""
    decisions: dict[Role, Decision] = {}
    states: dict[Role, GroupState] = {}
    for role in ROLES:
        decisions[role], states[role] = _decide_group(
            config, role, signals.role(role), replicas[role], now_s, state.group(role)
        )
    return Plan(decisions["prefill"], decisions["decode"]), PlannerState(states["prefill"], states["decode"])


def _decide_group(
    config: PolicyConfig, role: Role, signals: RoleSignals, current: int, now_s: float, state: GroupState
) -> tuple[Decision, GroupState]:
    limits = config.limits(role)
    target_s = config.latency_target_s(role)
    latency_name = "TTFT" if role == "prefill" else "TPOT"

    if current != limits.clamp(current):
        bounded = limits.clamp(current)
        reason = f"outside [{limits.min_replicas}, {limits.max_replicas}]"
        return Decision(role, current, bounded, reason), _after_change(state, now_s, up=bounded > current)

    if signals.waiting is None:
        return Decision(role, current, current, "metrics missing: hold"), replace(state, calm_since_s=None)

    pressure = _pressure(config, role, signals, current, target_s, latency_name)
    if pressure is not None:
        wanted, why = pressure
        calm = replace(state, calm_since_s=None)
        if current >= limits.max_replicas:
            return Decision(role, current, current, f"{why}; at max {limits.max_replicas}"), calm
        if state.last_scale_up_s is not None and now_s - state.last_scale_up_s < config.scale_up_cooldown_s:
            wait_s = config.scale_up_cooldown_s - (now_s - state.last_scale_up_s)
            return Decision(role, current, current, f"{why}; scale-up cool-down {wait_s:.0f}s left"), calm
        step = min(max(wanted - current, config.scale_up_step), config.max_step)
        target = limits.clamp(current + step)
        return Decision(role, current, target, why), _after_change(state, now_s, up=True)

    calm_reason = _calm(config, signals, target_s, latency_name)
    if calm_reason is None:
        return Decision(role, current, current, _in_band(signals, target_s, latency_name)), replace(
            state, calm_since_s=None
        )
    calm_since_s = now_s if state.calm_since_s is None else state.calm_since_s
    calm_state = replace(state, calm_since_s=calm_since_s)
    if current <= limits.min_replicas:
        return Decision(role, current, current, f"{calm_reason}; at min {limits.min_replicas}"), calm_state
    calm_for_s = now_s - calm_since_s
    if calm_for_s < config.scale_down_cooldown_s:
        wait_s = config.scale_down_cooldown_s - calm_for_s
        return Decision(role, current, current, f"{calm_reason}; scale-down cool-down {wait_s:.0f}s left"), calm_state
    target = limits.clamp(current - config.scale_down_step)
    return Decision(role, current, target, calm_reason), _after_change(state, now_s, up=False)


def _pressure(
    config: PolicyConfig, role: Role, signals: RoleSignals, current: int, target_s: float, latency_name: str
) -> tuple[int, str] | None:
    """(replicas wanted, why) when the group is over its SLO or backed up, else None."""
    wanted = 0
    reasons: list[str] = []
    latency = signals.latency_p95_s
    if latency is not None and latency > config.scale_up_ratio * target_s:
        # Proportional: latency roughly scales with load per replica.
        wanted = max(wanted, math.ceil(current * latency / target_s))
        reasons.append(f"{latency_name} p95 {latency:.3g}s > {config.scale_up_ratio:g} x {target_s:g}s")
    waiting = signals.waiting or 0.0
    if waiting > config.queue_per_replica * max(current, 1):
        wanted = max(wanted, math.ceil(waiting / config.queue_per_replica))
        reasons.append(f"{waiting:g} waiting > {config.queue_per_replica:g}/replica")
    if role == "decode" and signals.kv_usage is not None and signals.kv_usage > config.kv_usage_high:
        wanted = max(wanted, current + 1)
        reasons.append(f"KV usage {signals.kv_usage:.2f} > {config.kv_usage_high:g}")
    return (wanted, "; ".join(reasons)) if reasons else None


def _calm(config: PolicyConfig, signals: RoleSignals, target_s: float, latency_name: str) -> str | None:
    """Why a scale-down is allowed now, or None when it is not."""
    latency = signals.latency_p95_s
    if latency is not None and latency >= config.scale_down_ratio * target_s:
        return None
    if signals.waiting:
        return None
    if signals.kv_usage is not None and signals.kv_usage >= config.kv_usage_low:
        return None
    if latency is None:
        return "no traffic"
    return f"{latency_name} p95 {latency:.3g}s < {config.scale_down_ratio:g} x {target_s:g}s, queue empty"


def _in_band(signals: RoleSignals, target_s: float, latency_name: str) -> str:
    latency = "no traffic" if signals.latency_p95_s is None else f"{signals.latency_p95_s:.3g}s"
    return f"within band ({latency_name} p95 {latency}, target {target_s:g}s, {signals.waiting:g} waiting)"


def _after_change(state: GroupState, now_s: float, *, up: bool) -> GroupState:
    if up:
        return GroupState(last_scale_up_s=now_s, calm_since_s=None)
    # A decrease was itself decided on a calm sample: the next one is a full cool-down away.
    return GroupState(last_scale_up_s=state.last_scale_up_s, calm_since_s=now_s)
