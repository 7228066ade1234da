"""The Ray actors: `PrefillWorker`, `DecodeWorker` and the colocated `Worker`.

Each wraps one EngineCore in an `EngineLoop`. Methods are async (one event loop per actor
process) and never touch the engine directly; the step thread does. Actors are created
with `max_restarts` and `max_task_retries=0`: a crashed worker comes back as a new
process (new `instance_id`, empty engine) and the gateway fails what the old one held.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import ray

from engine.config import EngineConfig
from services.heap import freeze_long_lived
from services.workers.drain import drain_within
from services.workers.engine_loop import EngineLoop
from services.workers.transfer import TransferTicket
from services.workers.transports import make_transfer
from services.workers.types import Ack, PollResult, Role, StatsSnapshot, Submission, WorkerInfo

logger = logging.getLogger(__name__)


def _exit_soon(exc: BaseException, delay_s: float = 1.0) -> None:
    """Let the gateway poll the error outputs, then exit so that Ray restarts the actor."""
    logger.error("engine failed (%s); exiting in %.1f s so that the worker restarts", exc, delay_s)
    threading.Timer(delay_s, os._exit, args=(70,)).start()


@dataclass(frozen=True)
class ActorReleaseSink:
    """Tells a prefill actor that a receiver copied a held request's KV (device_transfer.py)."""

    actor: Any  # the producer's ray.actor.ActorHandle

    def release(self, request_id: str) -> None:
        self.actor.release_kv.remote([request_id])


class _EngineWorker:
    ROLE: Role = "worker"

    def __init__(
        self,
        engine_config: EngineConfig,
        replica_id: str,
        kv_transfer: str = "ray",
        consumer_lease_s: float = 30.0,
        torch_threads: int = 0,
    ) -> None:
        from engine.core import EngineCore

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if torch_threads > 0:
            import torch

            torch.set_num_threads(torch_threads)
        engine = EngineCore(engine_config)
        transfer = make_transfer(kv_transfer)
        if transfer.holds_slots and self.ROLE != "decode":  # receivers copy out of this engine's pools
            transfer.bind(engine.kv_pools(), ActorReleaseSink(ray.get_runtime_context().current_actor))
        self._loop = EngineLoop(
            engine,
            role=self.ROLE,
            replica_id=replica_id,
            transfer=transfer,
            max_num_seqs=engine_config.max_num_seqs,
            speculative=engine_config.speculative is not None,
            consumer_lease_s=consumer_lease_s,
            on_fatal=_exit_soon,
        )
        freeze_long_lived(f"{self.ROLE} {replica_id}")  # the engine lives as long as this actor
        self._loop.start()
        logger.info(
            "%s %s ready: model %s, instance %s",
            self.ROLE,
            replica_id,
            engine.model_name,
            self._loop.instance_id,
        )

    async def info(self) -> WorkerInfo:
        return self._loop.info

    async def get_tokenizer(self) -> Any:
        return self._loop.engine.tokenizer

    async def add_request(self, submission: Submission) -> Ack:
        import asyncio

        future = self._loop.add_request(
            submission.consumer,
            submission.request_id,
            submission.prompt_token_ids,
            submission.params,
            prefill_only=submission.prefill_only,
            continuation=submission.continuation,
        )
        return await asyncio.wrap_future(future)

    async def receive_kv(self, consumer: str, request_id: str, ticket: TransferTicket, timeout_s: float) -> Ack:
        return await self._loop.receive_kv(consumer, request_id, ticket, timeout_s)

    async def release_kv(self, request_ids: list[str]) -> None:
        """Receivers copied these held requests' KV (device hand-off): free their slots."""
        self._loop.release_kv(request_ids)

    async def abort(self, request_ids: list[str]) -> None:
        self._loop.abort(request_ids)

    async def poll(self, consumer: str, timeout_s: float) -> PollResult:
        return await self._loop.poll(consumer, timeout_s)

    async def stats(self) -> StatsSnapshot:
        return self._loop.stats()

    async def ping(self) -> str:
        return self._loop.instance_id

    async def drain(self, grace_s: float | None = None) -> None:
        """Take no new requests. With `grace_s`, return once the held requests have finished
        or, after `grace_s` seconds, have been handed back to their gateways to move
        elsewhere (`drain_within`, docs/design.md §6.9); without it, return at once (the
        planner waits)."""
        if grace_s is None:
            self._loop.drain()
            return
        await drain_within(self._loop, grace_s)


@ray.remote
class Worker(_EngineWorker):
    """Colocated: prefill and decode on one engine."""

    ROLE: Role = "worker"


@ray.remote
class PrefillWorker(_EngineWorker):
    """Prefills, samples the first token, and hands the request's KV off."""

    ROLE: Role = "prefill"


@ray.remote
class DecodeWorker(_EngineWorker):
    """Receives hand-offs and decodes (draft + verify); runs whole requests when asked."""

    ROLE: Role = "decode"


ACTOR_CLASSES: dict[Role, Any] = {"worker": Worker, "prefill": PrefillWorker, "decode": DecodeWorker}
