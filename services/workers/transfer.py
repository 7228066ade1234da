"""Moving a prefilled request's KV from a prefill worker to a decode worker (docs/design.md §5).

The prefill side turns an exported `KVHandoff` into a `TransferTicket` (`send`); the ticket
travels through the gateway to the decode worker, which turns it back into the hand-off
(`receive`, bounded by a timeout). Failures raise `TransferError`; the callers free the
request's slots and fail it, so a lost transfer never hangs a request.

Implementations: `RayObjectStoreTransfer` (CPU tensors through the Ray object store; works
across nodes), `InProcessTransfer` (both workers in one process), and `CudaIpcTransfer`
(device_transfer.py: device to device between processes on one node; the prefill engine holds
the request's slots and the decode worker copies them out, `holds_slots`).
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

from engine.handoff import HeldKV, KVHandoff
from engine.kv.pool import KVPool
from services.waits import answer_within


class TransferError(RuntimeError):
    """The KV of a request could not be moved (lost, timed out, or refused)."""


@dataclass(frozen=True)
class TransferTicket:
    request_id: str
    transport: str  # name of the KVTransfer that made it
    payload: Any  # transport-specific handle (a Ray ObjectRef for the object store)
    nbytes: int
    created_s: float  # time.time() on the prefill worker


class ReleaseSink(Protocol):
    """Where a receiver says it has copied a held request's KV (picklable: it rides in tickets)."""

    def release(self, request_id: str) -> None: ...


class KVTransfer(abc.ABC):
    name: str = "abstract"
    holds_slots: bool = False  # True: the producer holds slots (send_held), not exported tensors
    hold_s: float = 0.0  # how long a producer holds them at most

    @abc.abstractmethod
    def send(self, request_id: str, handoff: KVHandoff) -> TransferTicket:
        """Prefill side: make the hand-off reachable by the decode worker."""

    @abc.abstractmethod
    async def receive(self, ticket: TransferTicket, timeout_s: float) -> KVHandoff:
        """Decode side: fetch the hand-off; raises TransferError on failure or timeout."""

    def bind(self, pools: tuple[KVPool, KVPool | None], release: ReleaseSink) -> None:  # noqa: B027
        """Producer side of a transport that `holds_slots`: share the pools (target, draft)
        with receivers once; they report copies done to `release`."""

    def send_held(self, request_id: str, held: HeldKV, nbytes: int) -> TransferTicket:
        """Prefill side, for a transport that `holds_slots`: the ticket of slots held in place."""
        raise TransferError(f"{self.name} sends exported tensors, not held slots")

    def discard(self, ticket: TransferTicket) -> None:  # noqa: B027 (optional hook)
        """Drop a ticket that will never be received (its request failed or was aborted)."""


class RayObjectStoreTransfer(KVTransfer):
    """The hand-off (CPU tensors) is put in the prefill worker's object store; the ticket
    carries the ObjectRef, and the decode worker pulls the object directly from that node.
    The object lives while a ticket refers to it, and is lost with its owner (the prefill
    worker): the decode side then gets an error, not a hang."""

    name = "ray"

    def send(self, request_id: str, handoff: KVHandoff) -> TransferTicket:
        import ray

        ref = ray.put(handoff)
        return TransferTicket(request_id, self.name, ref, handoff.nbytes, time.time())

    async def receive(self, ticket: TransferTicket, timeout_s: float) -> KVHandoff:
        import ray

        try:
            return await answer_within(ticket.payload.future(), timeout_s)
        except asyncio.TimeoutError as exc:
            raise TransferError(f"KV transfer timed out after {timeout_s:g} s") from exc
        except ray.exceptions.RayError as exc:
            raise TransferError(f"KV transfer failed: {type(exc).__name__}: {exc}") from exc


class InProcessTransfer(KVTransfer):
    """Both workers live in one process: the ticket carries the hand-off itself."""

    name = "inprocess"

    def send(self, request_id: str, handoff: KVHandoff) -> TransferTicket:
        return TransferTicket(request_id, self.name, handoff, handoff.nbytes, time.time())

    async def receive(self, ticket: TransferTicket, timeout_s: float) -> KVHandoff:
        return ticket.payload
