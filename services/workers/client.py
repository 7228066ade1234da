"""The gateway's side of a worker: one async interface, two transports.

`RayWorkerClient` calls a worker actor; `LocalWorkerClient` drives an `EngineLoop` in the
gateway's own process (single-process serving and fast tests). Any failure to reach the
worker (dead, restarting, timed out) raises `WorkerUnavailable`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from typing import Any

from engine.handoff import Continuation
from engine.sampling_params import SamplingParams
from services.waits import answer_within
from services.workers.engine_loop import EngineLoop
from services.workers.transfer import TransferTicket
from services.workers.types import Ack, PollResult, Role, StatsSnapshot, Submission, WorkerInfo


class WorkerUnavailable(RuntimeError):
    """The worker did not answer: it died, is restarting, timed out, or the call failed."""


class WorkerClient(abc.ABC):
    def __init__(self, replica_id: str, role: Role) -> None:
        self.replica_id = replica_id
        self.role = role

    @abc.abstractmethod
    async def info(self, timeout_s: float) -> WorkerInfo: ...

    @abc.abstractmethod
    async def get_tokenizer(self, timeout_s: float) -> Any: ...

    @abc.abstractmethod
    async def add_request(
        self,
        consumer: str,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prefill_only: bool,
        timeout_s: float,
        continuation: Continuation | None = None,
    ) -> Ack: ...

    @abc.abstractmethod
    async def receive_kv(
        self, consumer: str, request_id: str, ticket: TransferTicket, transfer_timeout_s: float
    ) -> Ack: ...

    @abc.abstractmethod
    async def abort(self, request_ids: Sequence[str]) -> None: ...

    @abc.abstractmethod
    async def poll(self, consumer: str, timeout_s: float) -> PollResult: ...

    @abc.abstractmethod
    async def stats(self, timeout_s: float) -> StatsSnapshot: ...

    def close(self) -> None:  # noqa: B027 (optional)
        """Release what the client holds (the in-process engine for a local client)."""


class RayWorkerClient(WorkerClient):
    def __init__(self, replica_id: str, role: Role, handle: Any) -> None:
        super().__init__(replica_id, role)
        self.handle = handle

    async def _call(self, method: str, *args: Any, timeout_s: float | None) -> Any:
        import ray

        try:
            ref = getattr(self.handle, method).remote(*args)
            return await answer_within(ref.future(), timeout_s)
        except asyncio.TimeoutError as exc:
            raise WorkerUnavailable(f"{self.replica_id}: {method} timed out after {timeout_s} s") from exc
        except ray.exceptions.RayTaskError as exc:  # the method itself raised
            raise WorkerUnavailable(f"{self.replica_id}: {method} failed: {exc}") from exc
        except ray.exceptions.RayError as exc:  # dead, restarting, unreachable
            raise WorkerUnavailable(f"{self.replica_id}: {type(exc).__name__}") from exc

    async def info(self, timeout_s: float) -> WorkerInfo:
        return await self._call("info", timeout_s=timeout_s)

    async def get_tokenizer(self, timeout_s: float) -> Any:
        return await self._call("get_tokenizer", timeout_s=timeout_s)

    async def add_request(
        self,
        consumer: str,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prefill_only: bool,
        timeout_s: float,
        continuation: Continuation | None = None,
    ) -> Ack:
        submission = Submission(consumer, request_id, prompt_token_ids, params, prefill_only, continuation)
        return await self._call("add_request", submission, timeout_s=timeout_s)

    async def receive_kv(
        self, consumer: str, request_id: str, ticket: TransferTicket, transfer_timeout_s: float
    ) -> Ack:
        # The worker bounds the fetch itself; the extra margin covers installing the KV.
        return await self._call(
            "receive_kv",
            consumer,
            request_id,
            ticket,
            transfer_timeout_s,
            timeout_s=transfer_timeout_s + 30.0,
        )

    async def abort(self, request_ids: Sequence[str]) -> None:
        await self._call("abort", list(request_ids), timeout_s=10.0)

    async def poll(self, consumer: str, timeout_s: float) -> PollResult:
        return await self._call("poll", consumer, timeout_s, timeout_s=timeout_s + 10.0)

    async def stats(self, timeout_s: float) -> StatsSnapshot:
        return await self._call("stats", timeout_s=timeout_s)


class LocalWorkerClient(WorkerClient):
    """An EngineLoop in this process (no Ray)."""

    def __init__(self, replica_id: str, loop: EngineLoop) -> None:
        super().__init__(replica_id, loop.role)
        self.loop = loop

    def _check(self) -> None:
        if not self.loop.alive:
            raise WorkerUnavailable(f"{self.replica_id}: engine loop is not running")

    async def info(self, timeout_s: float) -> WorkerInfo:
        self._check()
        return self.loop.info

    async def get_tokenizer(self, timeout_s: float) -> Any:
        return self.loop.engine.tokenizer

    async def add_request(
        self,
        consumer: str,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prefill_only: bool,
        timeout_s: float,
        continuation: Continuation | None = None,
    ) -> Ack:
        self._check()
        future = self.loop.add_request(
            consumer, request_id, prompt_token_ids, params, prefill_only=prefill_only, continuation=continuation
        )
        try:
            return await answer_within(future, timeout_s)
        except asyncio.TimeoutError as exc:
            raise WorkerUnavailable(f"{self.replica_id}: add_request timed out") from exc

    async def receive_kv(
        self, consumer: str, request_id: str, ticket: TransferTicket, transfer_timeout_s: float
    ) -> Ack:
        self._check()
        return await self.loop.receive_kv(consumer, request_id, ticket, transfer_timeout_s)

    async def abort(self, request_ids: Sequence[str]) -> None:
        self.loop.abort(request_ids)

    async def poll(self, consumer: str, timeout_s: float) -> PollResult:
        self._check()
        return await self.loop.poll(consumer, timeout_s)

    async def stats(self, timeout_s: float) -> StatsSnapshot:
        self._check()
        return self.loop.stats()

    def close(self) -> None:
        self.loop.shutdown()
