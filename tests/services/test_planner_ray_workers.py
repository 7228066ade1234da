"""The planner's view of the workers through Ray (services/planner/ray_workers.py): named worker
actors on a private local Ray cluster, summed per pod, drained per pod."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from services.planner.drain import PodLoad
from services.planner.ray_workers import RayWorkerDirectory
from services.workers.types import StatsSnapshot, WorkerInfo
from tests.services.test_planner_waiting import HeldEngine

DEPLOYMENT = "plannertest"


class FakeWorker:
    """The three methods the directory calls, as a worker actor answers them."""

    def __init__(self, name: str, host: str, held: int) -> None:
        self.name, self.host, self.held, self.draining = name, host, held, False

    def info(self) -> WorkerInfo:
        return WorkerInfo(self.name, "decode", "i", "m", 64, 8, (), False, "inprocess", host=self.host)

    def stats(self) -> StatsSnapshot:
        return StatsSnapshot("i", HeldEngine(0, 0, 0).stats(), 0, True, self.draining, self.held)

    def drain(self) -> None:
        self.draining = True


@pytest.fixture
def workers(ray_cluster: None) -> Iterator[list[Any]]:
    import ray

    # pytest imports this file under a name Ray's workers cannot import: ship the class itself
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    actor: Any = ray.remote(num_cpus=0)(FakeWorker)
    layout = [("pod-a", 2), ("pod-a", 1), ("pod-b", 0), ("pod-c", 5)]
    handles = [
        actor.options(name=f"{DEPLOYMENT}-decode-{i}").remote(f"{DEPLOYMENT}-decode-{i}", host, held)
        for i, (host, held) in enumerate(layout)
    ]
    ray.get([h.info.remote() for h in handles])
    try:
        yield handles
    finally:
        for handle in handles:
            ray.kill(handle)


def test_loads_are_summed_per_pod_and_drain_reaches_every_worker_of_a_pod(workers: list[Any]) -> None:
    import ray

    directory = RayWorkerDirectory("unused: already connected", "dspark-tests", DEPLOYMENT)
    assert directory.loads("decode") == [
        PodLoad("pod-a", 3, False),
        PodLoad("pod-b", 0, False),
        PodLoad("pod-c", 5, False),
    ]
    assert directory.loads("prefill") == []
    directory.drain("decode", ["pod-a"])
    assert [s.draining for s in ray.get([h.stats.remote() for h in workers])] == [True, True, False, False]
    assert directory.loads("decode")[0] == PodLoad("pod-a", 3, True)
