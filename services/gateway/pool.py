"""The gateway's view of its workers: discovery, health, load, and the output pumps.

Per replica two tasks run:
- the monitor asks for engine stats every `stats_interval_s` (bounded by a timeout). The
  answer carries the worker's `instance_id`: a new one means the process restarted and
  lost its requests. A failed or timed-out call marks the replica down.
- the pump long-polls `poll(consumer, timeout)` while the replica is up and hands the
  events to the dispatcher. A failed poll (the actor died) marks the replica down at once.

Marking a replica down fails its in-flight requests (the dispatcher's `on_replica_down`)
and takes it out of routing; the monitor keeps trying and puts it back when it answers.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.router import ReplicaLoad
from services.workers.client import WorkerClient, WorkerUnavailable
from services.workers.types import Role, StatsSnapshot, WorkerEvent, WorkerInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolConfig:
    poll_timeout_s: float = 1.0
    stats_interval_s: float = 0.5
    health_timeout_s: float = 5.0
    discovery_interval_s: float = 2.0
    max_queued_per_worker: int | None = None  # None: as many as the engine batches (max_num_seqs)
    max_inflight_per_worker: int | None = None  # hard cap on a worker's requests (None: batch + queue)
    # the caps count what every gateway has on a worker (its reported running + waiting, at most
    # stats_interval_s old), not only this gateway's requests (docs/design.md §6.8)
    shared_admission: bool = False


class Discovery(abc.ABC):
    @abc.abstractmethod
    async def names(self) -> dict[str, Role]:
        """Replica ids that exist now, with their roles."""

    @abc.abstractmethod
    async def connect(self, replica_id: str, role: Role) -> WorkerClient: ...


class StaticDiscovery(Discovery):
    def __init__(self, clients: Sequence[WorkerClient]) -> None:
        self._clients = {c.replica_id: c for c in clients}

    async def names(self) -> dict[str, Role]:
        return {rid: c.role for rid, c in self._clients.items()}

    async def connect(self, replica_id: str, role: Role) -> WorkerClient:
        return self._clients[replica_id]


class RayDiscovery(Discovery):
    """Named worker actors of a deployment in the current Ray namespace."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment

    async def names(self) -> dict[str, Role]:
        from services.workers.deploy import list_workers

        return await asyncio.to_thread(list_workers, self.deployment)

    async def connect(self, replica_id: str, role: Role) -> WorkerClient:
        import ray

        from services.workers.client import RayWorkerClient

        handle = await asyncio.to_thread(ray.get_actor, replica_id)
        return RayWorkerClient(replica_id, role, handle)


@dataclass
class Replica:
    replica_id: str
    role: Role
    client: WorkerClient
    healthy: bool = False
    info: WorkerInfo | None = None
    instance_id: str | None = None
    stats: StatsSnapshot | None = None
    inflight: int = 0
    last_error: str | None = None
    up: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def draining(self) -> bool:
        return self.stats is not None and self.stats.draining

    def load(self, max_queued: int | None, max_inflight: int | None = None, shared: bool = False) -> ReplicaLoad:
        batch = self.info.max_num_seqs if self.info else 1
        capacity = batch + (batch if max_queued is None else max_queued)
        if max_inflight is not None:
            capacity = min(capacity, max_inflight)
        engine = self.stats.engine if self.stats else None
        return ReplicaLoad(
            replica_id=self.replica_id,
            # a draining worker serves what it holds but is offered nothing new
            healthy=self.healthy and not self.draining,
            inflight=self.inflight,
            capacity=capacity,
            num_running=getattr(engine, "num_running", 0),
            num_waiting=getattr(engine, "num_waiting", 0),
            kv_usage=float(getattr(engine, "kv_usage_ratio", 0.0)),
            shared_capacity=shared,
        )


class WorkerPool:
    def __init__(self, discovery: Discovery, consumer_id: str, config: PoolConfig) -> None:
        self.discovery = discovery
        self.consumer_id = consumer_id
        self.config = config
        self.replicas: dict[str, Replica] = {}
        # set by the owner (dispatcher / app) before start()
        self.on_events: Callable[[Replica, Sequence[WorkerEvent]], None] = lambda r, e: None
        self.on_down: Callable[[Replica, str], None] = lambda r, why: None
        self.on_up: Callable[[Replica], None] = lambda r: None
        self.on_stats: Callable[[Replica, StatsSnapshot], None] = lambda r, s: None
        self.on_removed: Callable[[Replica], None] = lambda r: None
        self._discovery_task: asyncio.Task[None] | None = None
        self.tokenizer: Any = None
        self._tokenizer_lock = asyncio.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._discover_once()
        self._discovery_task = asyncio.create_task(self._discovery_loop(), name="pool-discovery")

    async def stop(self) -> None:
        tasks = [t for r in self.replicas.values() for t in r.tasks]
        if self._discovery_task is not None:
            tasks.append(self._discovery_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- queries ----------------------------------------------------------------------------

    def loads(self) -> dict[str, list[ReplicaLoad]]:
        cfg = self.config
        by_pool: dict[str, list[ReplicaLoad]] = {"colocated": [], "prefill": [], "decode": []}
        for replica in self.replicas.values():
            pool = "colocated" if replica.role == "worker" else replica.role
            by_pool[pool].append(
                replica.load(cfg.max_queued_per_worker, cfg.max_inflight_per_worker, cfg.shared_admission)
            )
        return by_pool

    def healthy(self, role: Role | None = None) -> list[Replica]:
        return [r for r in self.replicas.values() if r.healthy and (role is None or r.role == role)]

    def any_info(self) -> WorkerInfo | None:
        for replica in self.healthy():
            if replica.info is not None:
                return replica.info
        return None

    def ready(self) -> bool:
        """Can serve a request end to end (one colocated worker, or one of each PD pool)."""
        roles = {r.role for r in self.healthy()}
        return bool(roles) and self.tokenizer is not None

    # -- discovery --------------------------------------------------------------------------

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.discovery_interval_s)
            try:
                await self._discover_once()
            except Exception:
                logger.exception("worker discovery failed")

    async def _discover_once(self) -> None:
        names = await self.discovery.names()
        for replica_id, role in names.items():
            if replica_id in self.replicas:
                continue
            try:
                client = await self.discovery.connect(replica_id, role)
            except Exception as exc:  # it went away between listing and connecting
                logger.warning("cannot connect to worker %s: %s", replica_id, exc)
                continue
            replica = Replica(replica_id, role, client)
            self.replicas[replica_id] = replica
            replica.tasks = [
                asyncio.create_task(self._monitor(replica), name=f"monitor-{replica_id}"),
                asyncio.create_task(self._pump(replica), name=f"pump-{replica_id}"),
            ]
            logger.info("discovered %s worker %s", role, replica_id)
        for replica_id in [rid for rid in self.replicas if rid not in names]:
            replica = self.replicas.pop(replica_id)
            for task in replica.tasks:
                task.cancel()
            if replica.healthy:
                self._mark_down(replica, "worker removed")
            self.on_removed(replica)
            logger.info("worker %s is gone", replica_id)

    # -- health -----------------------------------------------------------------------------

    def _mark_down(self, replica: Replica, why: str) -> None:
        """Take the replica out of routing; on the healthy -> down transition, fail what it held."""
        was_healthy = replica.healthy
        replica.healthy = False
        replica.last_error = why
        replica.up.clear()
        if was_healthy:
            logger.warning("worker %s is down: %s", replica.replica_id, why)
            self.on_down(replica, why)

    def mark_down(self, replica_id: str, why: str) -> None:
        replica = self.replicas.get(replica_id)
        if replica is not None:
            self._mark_down(replica, why)

    async def _monitor(self, replica: Replica) -> None:
        cfg = self.config
        while True:
            try:
                snapshot = await replica.client.stats(cfg.health_timeout_s)
                if replica.instance_id is not None and snapshot.instance_id != replica.instance_id:
                    self._mark_down(replica, "worker restarted")
                    replica.info = None
                if replica.info is None or replica.info.instance_id != snapshot.instance_id:
                    replica.info = await replica.client.info(cfg.health_timeout_s)
                replica.instance_id = snapshot.instance_id
                replica.stats = snapshot
                if not snapshot.step_loop_alive:
                    self._mark_down(replica, "engine step loop stopped")
                else:
                    await self._ensure_tokenizer(replica)
                    if not replica.healthy:
                        replica.healthy = True
                        replica.last_error = None
                        replica.up.set()
                        logger.info("worker %s is up (instance %s)", replica.replica_id, snapshot.instance_id)
                        self.on_up(replica)
                self.on_stats(replica, snapshot)
            except WorkerUnavailable as exc:
                self._mark_down(replica, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("monitoring worker %s failed", replica.replica_id)
                self._mark_down(replica, f"monitor error: {exc}")
            await asyncio.sleep(cfg.stats_interval_s)

    async def _ensure_tokenizer(self, replica: Replica) -> None:
        if self.tokenizer is not None:
            return
        async with self._tokenizer_lock:
            if self.tokenizer is None:
                self.tokenizer = await replica.client.get_tokenizer(max(self.config.health_timeout_s, 30.0))

    async def _pump(self, replica: Replica) -> None:
        cfg = self.config
        while True:
            await replica.up.wait()
            instance_id = replica.instance_id
            try:
                result = await replica.client.poll(self.consumer_id, cfg.poll_timeout_s)
            except WorkerUnavailable as exc:
                self._mark_down(replica, str(exc))
                await asyncio.sleep(0.1)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("polling worker %s failed", replica.replica_id)
                self._mark_down(replica, f"poll error: {exc}")
                await asyncio.sleep(0.1)
                continue
            if result.instance_id != instance_id:
                self._mark_down(replica, "worker restarted")
                continue
            if result.events:
                try:
                    self.on_events(replica, result.events)
                except Exception:
                    logger.exception("dispatching events of %s failed", replica.replica_id)
