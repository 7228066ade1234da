"""Scale-downs remove drained, idle workers named in `workersToDelete`, never random ones.

The API server is the strict fake (tests/services/kube_api.py) with a stand-in for KubeRay's
reconciler on every write: a decrease deletes the pods named in `workersToDelete`, and random
pods of the group for any shortfall, as KubeRay does with in-tree autoscaling off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.gateway.pool import Replica
from services.planner.drain import Downscaler, PodLoad, WorkerDirectoryError, choose_victims
from services.planner.kube import RayClusterScaler, custom_objects_api
from services.planner.loop import GroupNames, evaluate
from services.planner.policy import GroupLimits, PlannerState, PolicyConfig, Role, Signals
from services.workers.types import StatsSnapshot
from tests.services.kube_api import StrictKubeApi
from tests.services.test_planner_kube import CLUSTER, NAMESPACE, RAYCLUSTERS, raycluster
from tests.services.test_planner_waiting import HeldEngine, snapshot

CONFIG = PolicyConfig(
    ttft_target_s=1.0,
    tpot_target_s=0.1,
    prefill=GroupLimits(1, 4),
    decode=GroupLimits(1, 4),
    scale_down_cooldown_s=0.0,
)
IDLE = Signals(None, None, 0.0, 0.0, 0.0, 0.0)
# Prefill in band; decode idle, so only decode goes down.
DECODE_IDLE = Signals(0.8, None, 0.0, 0.0, 0.1, 0.0)


@dataclass
class Cluster:
    """Worker pods and what they hold; KubeRay's pod deletions are recorded."""

    pods: dict[Role, dict[str, int]]
    drained: set[str] = field(default_factory=set)
    deleted: list[tuple[str, bool]] = field(default_factory=list)  # (pod, was it drained)

    def loads(self, role: Role) -> list[PodLoad]:
        return [PodLoad(pod, held, pod in self.drained) for pod, held in sorted(self.pods[role].items())]

    def drain(self, role: Role, pods: Sequence[str]) -> None:
        self.drained |= set(pods)

    def reconcile(self, key: Any, before: dict[str, Any], after: dict[str, Any]) -> None:
        old = {g["groupName"]: g for g in before["spec"]["workerGroupSpecs"]}
        for group in after["spec"]["workerGroupSpecs"]:
            role, pods = group["groupName"], self.pods[group["groupName"]]
            excess = len(pods) - group["replicas"]
            if group["replicas"] >= old[role]["replicas"] or excess <= 0:
                continue
            named = [p for p in group.get("scaleStrategy", {}).get("workersToDelete", []) if p in pods]
            doomed = named[:excess] + sorted(set(pods) - set(named))[: excess - len(named)]
            for pod in doomed:
                self.deleted.append((pod, pod in self.drained))
                del pods[pod]


class Signal:
    def __init__(self, signals: Signals) -> None:
        self.signals = signals

    def read(self) -> Signals:
        return self.signals


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, StrictKubeApi, RayClusterScaler]]:
    state = Cluster(pods={"prefill": {"p-a": 0, "p-b": 0}, "decode": {"d-a": 5, "d-b": 1, "d-c": 3}})
    kube = StrictKubeApi(on_write=state.reconcile)
    kube.put(RAYCLUSTERS, raycluster(prefill=2, decode=3))
    try:
        yield state, kube, RayClusterScaler(custom_objects_api(kube.url), NAMESPACE, CLUSTER)
    finally:
        kube.close()


def decode_replicas(kube: StrictKubeApi) -> int:
    spec = kube.get(RAYCLUSTERS, NAMESPACE, CLUSTER)["spec"]["workerGroupSpecs"]
    return int(next(g for g in spec if g["groupName"] == "decode")["replicas"])


def run(
    signals: Signals, scaler: RayClusterScaler, downscaler: Downscaler | None, state: PlannerState, now_s: float
) -> PlannerState:
    _, state = evaluate(CONFIG, Signal(signals), scaler, GroupNames(), state, now_s, downscaler=downscaler)  # type: ignore[arg-type]
    return state


def test_decrease_drains_the_idlest_pod_then_removes_exactly_it(
    cluster: tuple[Cluster, StrictKubeApi, RayClusterScaler],
) -> None:
    pods, kube, scaler = cluster
    downscaler = Downscaler(pods)
    state = run(DECODE_IDLE, scaler, downscaler, PlannerState(), 0.0)
    assert pods.drained == {"d-b"} and not kube.patches()  # drained first, nothing removed yet
    state = run(DECODE_IDLE, scaler, downscaler, state, 1.0)
    assert not kube.patches()  # d-b still holds a request: wait
    pods.pods["decode"]["d-b"] = 0
    state = run(DECODE_IDLE, scaler, downscaler, state, 2.0)
    assert pods.deleted == [("d-b", True)] and decode_replicas(kube) == 2
    (sent,) = kube.patches()
    assert {"op": "add", "path": "/spec/workerGroupSpecs/1/scaleStrategy", "value": {"workersToDelete": ["d-b"]}} in (
        sent.body
    )


def test_without_a_way_to_drain_a_decrease_is_held(cluster: tuple[Cluster, StrictKubeApi, RayClusterScaler]) -> None:
    pods, kube, scaler = cluster
    state = PlannerState()
    for now_s in range(3):
        state = run(IDLE, scaler, None, state, float(now_s))
    assert not kube.patches() and not pods.deleted and decode_replicas(kube) == 3


def test_drain_timeout_removes_busy_victims_and_gone_victims_do_not_count(
    cluster: tuple[Cluster, StrictKubeApi, RayClusterScaler],
) -> None:
    pods, kube, scaler = cluster
    downscaler = Downscaler(pods, drain_timeout_s=10.0)
    state = run(DECODE_IDLE, scaler, downscaler, PlannerState(), 0.0)
    state = run(DECODE_IDLE, scaler, downscaler, state, 5.0)
    assert not kube.patches()
    run(DECODE_IDLE, scaler, downscaler, state, 10.0)
    assert pods.deleted == [("d-b", True)]
    # A victim that vanished meanwhile (its pod crashed) is not subtracted again.
    downscaler.begin("decode", 1, "idle", 20.0)
    victim = next(iter(downscaler.pending["decode"].victims))
    del pods.pods["decode"][victim]
    before = decode_replicas(kube)
    downscaler.finish(scaler, {"prefill": "prefill", "decode": "decode"}, 21.0)
    assert decode_replicas(kube) == before and not downscaler.pending


def test_victims_are_draining_pods_first_then_the_least_loaded() -> None:
    loads = [PodLoad("a", 0, False), PodLoad("b", 7, True), PodLoad("c", 2, False), PodLoad("d", 0, False)]
    assert choose_victims(loads, 3) == ("b", "a", "d")


def test_worker_drain_reaches_its_stats_and_the_pool_stops_routing_to_it() -> None:
    from services.workers.engine_loop import EngineLoop
    from services.workers.transfer import InProcessTransfer

    engine = HeldEngine(held=3, running=1, waiting=0)
    loop = EngineLoop(
        engine,  # type: ignore[arg-type]
        role="decode",
        replica_id="decode-0",
        transfer=InProcessTransfer(),
        max_num_seqs=8,
        speculative=False,
    ).start()
    try:
        assert not loop.stats().draining
        loop.drain()
        deadline = time.monotonic() + 5
        while not loop.stats().draining:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stats = loop.stats()
        assert stats.num_held == 3 and loop.info.host
    finally:
        loop.shutdown()
    replica = Replica("decode-0", "decode", client=None, healthy=True)  # type: ignore[arg-type]
    replica.stats = StatsSnapshot("i", snapshot("decode", engine), 0, True)
    assert replica.load(None).healthy
    replica.stats = stats
    assert not replica.load(None).healthy and replica.healthy  # still polled, offered nothing new


def test_a_new_planner_takes_over_pods_left_draining(cluster: tuple[Cluster, StrictKubeApi, RayClusterScaler]) -> None:
    """`--once` runs, or a restart: the drain begun by one process is finished by the next."""
    pods, kube, scaler = cluster
    run(DECODE_IDLE, scaler, Downscaler(pods), PlannerState(), 0.0)
    assert pods.drained == {"d-b"} and not kube.patches()
    pods.pods["decode"]["d-b"] = 0
    run(DECODE_IDLE, scaler, Downscaler(pods), PlannerState(), 100.0)
    assert pods.deleted == [("d-b", True)] and decode_replicas(kube) == 2


class Unreachable:
    def loads(self, role: Role) -> list[PodLoad]:
        raise WorkerDirectoryError("ray://head:10001 did not answer")

    def drain(self, role: Role, pods: Sequence[str]) -> None:
        raise AssertionError("never reached")


def test_unreachable_workers_hold_decreases_only(cluster: tuple[Cluster, StrictKubeApi, RayClusterScaler]) -> None:
    _, kube, scaler = cluster
    downscaler = Downscaler(Unreachable())
    run(DECODE_IDLE, scaler, downscaler, PlannerState(), 0.0)
    assert not kube.patches()
    busy = Signals(5.0, None, 0.0, 0.0, 0.1, 0.0)  # TTFT breach: prefill goes up, decode would go down
    run(busy, scaler, downscaler, PlannerState(), 1.0)
    spec = {
        g["groupName"]: g["replicas"] for g in kube.get(RAYCLUSTERS, NAMESPACE, CLUSTER)["spec"]["workerGroupSpecs"]
    }
    assert spec == {"prefill": 4, "decode": 3}
