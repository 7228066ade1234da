"""Moving a prefilled request's KV from a prefill worker to a decode worker (docs/design.md §5).

The prefill side turns an exported `KVHandoff` into a `TransferTicket` (`send`); the ticket
travels through the gateway to the decode worker, which turns it back into the hand-off
(`receive`, bounded by a timeout). Failures raise `TransferError`; the callers free the
request's slots and fail it, so a lost transfer never hangs a request.

Implementations: `RayObjectStoreTransfer` (CPU tensors through the Ray object store; works
across nodes) and `InProcessTransfer` (both workers in one process). A device-to-device
implementation (NCCL/RCCL send/recv or CUDA IPC) plugs in behind the same interface.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.handoff import KVHandoff


class TransferError(RuntimeError):
    """The KV of a request could not be moved (lost, timed out, or refused)."""


@dataclass(frozen=True)
class TransferTicket:
    request_id: str
    transport: str  # name of the KVTransfer that made it
    payload: Any  # transport-specific handle (a Ray ObjectRef for the object store)
    nbytes: int
    created_s: float  # time.time() on the prefill worker


class KVTransfer(abc.ABC):
    name: str = "abstract"

    @abc.abstractmethod
    def send(self, request_id: str, handoff: KVHandoff) -> TransferTicket:
        """Prefill side: make the hand-off reachable by the decode worker."""

    @abc.abstractmethod
    async def receive(self, ticket: TransferTicket, timeout_s: float) -> KVHandoff:
        """Decode side: fetch the hand-off; raises TransferError on failure or timeout."""

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
            return await asyncio.wait_for(asyncio.wrap_future(ticket.payload.future()), timeout_s)
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


_TRANSFERS: dict[str, Callable[[], KVTransfer]] = {
    RayObjectStoreTransfer.name: RayObjectStoreTransfer,
    InProcessTransfer.name: InProcessTransfer,
}


def register_transfer(name: str, factory: Callable[[], KVTransfer]) -> None:
    _TRANSFERS[name] = factory


def make_transfer(name: str) -> KVTransfer:
    try:
        return _TRANSFERS[name]()
    except KeyError:
        raise ValueError(f"kv_transfer: unknown transfer {name!r}; known: {sorted(_TRANSFERS)}") from None
