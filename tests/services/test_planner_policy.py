"""The planner's decisions (services/planner/policy.py): bounds, cool-downs, hysteresis."""

from __future__ import annotations

import random

import pytest

from services.planner.policy import (
    Decision,
    GroupLimits,
    PlannerState,
    PolicyConfig,
    Role,
    Signals,
    decide,
)

TTFT_S, TPOT_S = 2.0, 0.1
CONFIG = PolicyConfig(
    ttft_target_s=TTFT_S,
    tpot_target_s=TPOT_S,
    prefill=GroupLimits(1, 6),
    decode=GroupLimits(2, 8),
    scale_up_cooldown_s=60,
    scale_down_cooldown_s=300,
    max_step=2,
)


def signals(
    ttft: float | None = 1.2,
    tpot: float | None = 0.07,
    prefill_waiting: float | None = 0.0,
    decode_waiting: float | None = 0.0,
    prefill_kv: float | None = 0.1,
    decode_kv: float | None = 0.6,
) -> Signals:
    """Defaults sit inside the hysteresis band: no change either way."""
    return Signals(ttft, tpot, prefill_waiting, decode_waiting, prefill_kv, decode_kv)


IDLE = signals(ttft=None, tpot=None, decode_kv=0.0, prefill_kv=0.0)
HEALTHY_LOW = signals(ttft=0.3, tpot=0.02, decode_kv=0.1)


class Sim:
    """Feeds the policy and applies its decisions, as the planner loop does."""

    def __init__(self, prefill: int = 2, decode: int = 3, config: PolicyConfig = CONFIG) -> None:
        self.config = config
        self.replicas: dict[Role, int] = {"prefill": prefill, "decode": decode}
        self.state = PlannerState()
        self.changes: list[Decision] = []

    def step(self, now_s: float, observed: Signals) -> tuple[Decision, Decision]:
        plan, self.state = decide(self.config, observed, dict(self.replicas), now_s, self.state)
        for decision in plan.decisions():
            if decision.changed:
                self.changes.append(decision)
            self.replicas[decision.role] = decision.target
        return plan.decisions()


def test_in_band_holds() -> None:
    prefill, decode = Sim().step(0, signals())
    assert not prefill.changed and not decode.changed
    assert "within band" in prefill.reason


def test_ttft_breach_scales_prefill_only_proportionally_capped() -> None:
    sim = Sim(prefill=2, decode=3)
    prefill, decode = sim.step(0, signals(ttft=2.5))  # 1.25 x target: ceil(2 * 1.25) = 3
    assert (prefill.current, prefill.target) == (2, 3)
    assert "TTFT p95 2.5s" in prefill.reason
    assert not decode.changed
    sim = Sim(prefill=2)
    prefill, _ = sim.step(0, signals(ttft=20.0))  # wants 20, capped at +max_step
    assert prefill.target == 4


def test_tpot_breach_scales_decode_only() -> None:
    prefill, decode = Sim().step(0, signals(tpot=0.15))
    assert not prefill.changed
    assert (decode.current, decode.target) == (3, 5)  # ceil(3 * 1.5)


def test_queue_and_kv_pressure() -> None:
    prefill, _ = Sim(prefill=2).step(0, signals(prefill_waiting=40))  # > 8/replica x 2
    assert prefill.target == 4 and "40 waiting" in prefill.reason
    prefill, _ = Sim(prefill=2).step(0, signals(prefill_waiting=16))  # exactly 8/replica
    assert not prefill.changed
    _, decode = Sim(decode=3).step(0, signals(decode_kv=0.95))
    assert decode.target == 4 and "KV usage" in decode.reason
    prefill, _ = Sim().step(0, signals(prefill_kv=0.99))  # prefill KV alone does not scale up
    assert not prefill.changed


def test_max_bound_and_out_of_bounds_clamp() -> None:
    prefill, _ = Sim(prefill=6).step(0, signals(ttft=10.0))
    assert not prefill.changed and "at max 6" in prefill.reason
    prefill, decode = Sim(prefill=9, decode=1).step(0, signals())
    assert (prefill.target, decode.target) == (6, 2)
    assert "outside" in prefill.reason and "outside" in decode.reason


def test_scale_up_cooldown() -> None:
    sim = Sim(prefill=1)
    assert sim.step(0, signals(ttft=2.5))[0].target == 2
    held = sim.step(30, signals(ttft=2.5))[0]
    assert not held.changed and "cool-down 30s left" in held.reason
    assert sim.step(60, signals(ttft=2.5))[0].target == 3


def test_scale_down_needs_calm_for_the_cooldown() -> None:
    sim = Sim(prefill=3, decode=5)
    for t in range(0, 300, 30):
        prefill, decode = sim.step(t, HEALTHY_LOW)
        assert not prefill.changed and not decode.changed, (t, prefill, decode)
    prefill, decode = sim.step(300, HEALTHY_LOW)
    assert (prefill.target, decode.target) == (2, 4)
    # The change restarts the clock: the next step down is another cool-down away.
    assert not any(d.changed for d in sim.step(330, HEALTHY_LOW))
    assert [d.target for d in sim.step(600, HEALTHY_LOW)] == [1, 3]


def test_no_traffic_scales_to_min_after_cooldowns() -> None:
    sim = Sim(prefill=4, decode=6)
    t = 0
    while t <= 3600:
        sim.step(t, IDLE)
        t += 30
    assert sim.replicas == {"prefill": 1, "decode": 2}
    assert all(d.target == d.current - 1 for d in sim.changes)
    assert sim.changes[0].reason == "no traffic"
    prefill, decode = sim.step(t, IDLE)
    assert "at min" in prefill.reason and "at min" in decode.reason


def test_down_blocked_by_queue_or_kv_or_latency_in_band() -> None:
    for blocker in (
        signals(ttft=0.3, tpot=0.02, prefill_waiting=1, decode_waiting=1, decode_kv=0.1),
        signals(ttft=0.3, tpot=0.02, prefill_kv=0.7, decode_kv=0.7),
        signals(ttft=1.5, tpot=0.08, decode_kv=0.1),
    ):
        sim = Sim(prefill=3, decode=5)
        for t in range(0, 1000, 30):
            sim.step(t, blocker)
        assert sim.changes == [], blocker


def test_one_busy_sample_restarts_the_down_clock() -> None:
    sim = Sim(prefill=3)
    sim.step(0, HEALTHY_LOW)
    sim.step(200, signals())  # back inside the band
    assert not sim.step(320, HEALTHY_LOW)[0].changed
    assert not sim.step(500, HEALTHY_LOW)[0].changed
    assert sim.step(620, HEALTHY_LOW)[0].target == 2


def test_scale_up_starts_the_down_clock() -> None:
    sim = Sim(prefill=1)
    sim.step(0, signals(ttft=3.0))
    assert sim.replicas["prefill"] == 2
    assert not sim.step(30, HEALTHY_LOW)[0].changed
    assert not sim.step(299, HEALTHY_LOW)[0].changed
    assert sim.step(330, HEALTHY_LOW)[0].target == 1


def test_missing_metrics_hold() -> None:
    sim = Sim(prefill=3, decode=5)
    for t in range(0, 1000, 30):
        prefill, decode = sim.step(t, signals(ttft=9.0, tpot=0.5, prefill_waiting=None, decode_waiting=None))
        assert "metrics missing" in prefill.reason and "metrics missing" in decode.reason
    assert sim.changes == []
    # Missing gauges also interrupt a calm stretch.
    sim.step(1000, HEALTHY_LOW)
    sim.step(1200, signals(prefill_waiting=None, decode_waiting=None))
    assert not sim.step(1310, HEALTHY_LOW)[0].changed


@pytest.mark.parametrize("seed", range(5))
def test_noise_around_the_up_threshold_does_not_flap(seed: int) -> None:
    """TTFT p95 jittering just under the target never moves the group; jittering across
    it only ever moves it up (at most once per cool-down), never back down."""
    rng = random.Random(seed)
    sim = Sim(prefill=2)
    for t in range(0, 3600, 15):
        sim.step(t, signals(ttft=TTFT_S * rng.uniform(0.55, 0.99), tpot=TPOT_S * rng.uniform(0.55, 0.99)))
    assert sim.changes == []

    sim = Sim(prefill=2, config=PolicyConfig(TTFT_S, TPOT_S, prefill=GroupLimits(1, 20), max_step=1))
    for t in range(0, 600, 15):
        sim.step(t, signals(ttft=TTFT_S * rng.uniform(0.6, 1.1)))
    prefill_changes = [d for d in sim.changes if d.role == "prefill"]
    assert all(d.target > d.current for d in prefill_changes)
    assert len(prefill_changes) <= 600 // CONFIG.scale_up_cooldown_s


def test_noise_around_the_down_threshold_does_not_flap() -> None:
    rng = random.Random(7)
    sim = Sim(prefill=3)
    for t in range(0, 3600, 15):
        # Every few samples one lands above 0.5 x target and restarts the calm clock.
        ttft = TTFT_S * (rng.uniform(0.55, 0.7) if t % 120 == 0 else rng.uniform(0.2, 0.45))
        sim.step(t, signals(ttft=ttft, tpot=0.07))
    assert [d for d in sim.changes if d.role == "prefill"] == []


def test_decide_is_pure() -> None:
    state = PlannerState()
    replicas: dict[Role, int] = {"prefill": 1, "decode": 2}
    first = decide(CONFIG, signals(ttft=3.0), replicas, 0, state)
    assert decide(CONFIG, signals(ttft=3.0), replicas, 0, state) == first
    assert state == PlannerState() and replicas == {"prefill": 1, "decode": 2}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ttft_target_s": 0}, "ttft_target_s"),
        ({"scale_down_ratio": 1.0}, "hysteresis"),
        ({"kv_usage_low": 0.95}, "kv_usage_low"),
        ({"scale_up_step": 5}, "max_step"),
        ({"scale_down_cooldown_s": -1}, "cool-downs"),
    ],
)
def test_config_validation(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"ttft_target_s": TTFT_S, "tpot_target_s": TPOT_S}
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("low, high", [(3, 2), (0, 0), (-1, 2)])
def test_group_limits_validation(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="replicas"):
        GroupLimits(low, high)
