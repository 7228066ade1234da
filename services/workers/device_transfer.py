"""Device-to-device KV hand-off between two worker processes on one node (docs/design.md §5.7).

The prefill engine keeps a handed-off request's slots (`EngineCore.hold_kv`); the ticket
carries those slot ids and, once per producer, CUDA/HIP IPC handles of the producer's KV pool
tensors. The decode worker maps the pools (once per producer, cached), gathers the request's
slots into tensors on its own device on a side stream, waits for that copy, then tells the
producer to free the slots (`ReleaseSink`). A producer frees a hold on its own after
`hold_s`; a receiver refuses a ticket older than half of that, so a late copy never reads
slots that were reused. Nothing passes through host memory.

Both processes must see the same GPU (same node, same device UUID): a ticket from elsewhere
is refused with a `TransferError` naming the mismatch. The object store (`ray`) stays the
transport across nodes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.handoff import HeldKV, KVHandoff
from engine.kv.pool import KVPool, gather_slots
from services.waits import within
from services.workers.transfer import KVTransfer, ReleaseSink, TransferError, TransferTicket

# (rebuild function, its arguments): torch.multiprocessing's picklable IPC form of a tensor
SharedTensor = tuple[Callable[..., torch.Tensor], tuple[Any, ...]]


@dataclass(frozen=True)
class PoolHandles:
    """A producer's KV pools as IPC handles: [L, num_slots + 1, Hkv, D] each."""

    producer_id: str  # unique per producer process
    node: str  # hostname and boot id: IPC handles open only on the node that made them
    device_uuid: str
    device_index: int  # the producer's index of that GPU: the handles open on this index
    target: tuple[SharedTensor, SharedTensor]  # k, v
    draft: tuple[SharedTensor, SharedTensor] | None


@dataclass(frozen=True)
class DevicePayload:
    pools: PoolHandles
    held: HeldKV
    release: ReleaseSink
    hold_s: float


def node_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _share(t: torch.Tensor) -> SharedTensor:
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(t)
    return rebuild, args


class CudaIpcTransfer(KVTransfer):
    """Same-node device hand-off through CUDA/HIP IPC of the producer's pools."""

    name = "cuda-ipc"
    holds_slots = True

    def __init__(self, hold_s: float = 60.0) -> None:
        self.hold_s = hold_s
        self._pools: PoolHandles | None = None
        self._release: ReleaseSink | None = None
        # receiver: producer id -> its pools mapped here, (k, v) target and draft
        self._mapped: dict[str, tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]] = {}
        self._lock = threading.Lock()
        self._stream: torch.cuda.Stream | None = None

    # -- producer -----------------------------------------------------------------------------

    def bind(self, pools: tuple[KVPool, KVPool | None], release: ReleaseSink) -> None:
        """Share this producer's pools (`KVPool`s: target, draft or None) once; `release` is
        where receivers report copies done."""
        target, draft = pools
        device = target.k.device
        if device.type != "cuda":
            raise ValueError(f"kv_transfer: {self.name} needs the KV pools on a GPU, not {device.type}")
        self._pools = PoolHandles(
            producer_id=f"{node_id()}/{os.getpid()}/{id(self)}",
            node=node_id(),
            device_uuid=device_uuid(device),
            device_index=device.index if device.index is not None else torch.cuda.current_device(),
            target=(_share(target.k), _share(target.v)),
            draft=None if draft is None else (_share(draft.k), _share(draft.v)),
        )
        self._release = release

    def send_held(self, request_id: str, held: HeldKV, nbytes: int) -> TransferTicket:
        if self._pools is None or self._release is None:
            raise TransferError(f"{self.name}: the producer's pools were never bound")
        payload = DevicePayload(self._pools, held, self._release, self.hold_s)
        return TransferTicket(request_id, self.name, payload, nbytes, time.time())

    def send(self, request_id: str, handoff: KVHandoff) -> TransferTicket:
        raise TransferError(f"{self.name} moves held slots (send_held), not exported tensors")

    # -- receiver -----------------------------------------------------------------------------

    async def receive(self, ticket: TransferTicket, timeout_s: float) -> KVHandoff:
        try:
            return await within(asyncio.to_thread(self.copy_out, ticket), timeout_s)
        except asyncio.TimeoutError as exc:
            raise TransferError(f"KV transfer timed out after {timeout_s:g} s") from exc

    def copy_out(self, ticket: TransferTicket) -> KVHandoff:
        """Gather the held slots into this device, wait for the copy, release the producer."""
        payload: DevicePayload = ticket.payload
        self.check(ticket)
        target_pool, draft_pool = self._map(payload.pools)
        device = target_pool[0].device
        stream = self._side_stream(device)
        slots = torch.from_numpy(payload.held.slots)
        with torch.cuda.stream(stream):
            index = slots.to(device, non_blocking=True)
            target = gather_slots(*target_pool, index)
            draft = None if draft_pool is None else gather_slots(*draft_pool, index)
        stream.synchronize()
        for t in (target, draft):  # the engine's stream uses them next
            if t is not None:
                t.record_stream(torch.cuda.current_stream(device))
        payload.release.release(payload.held.request_id)
        return payload.held.with_kv(target, draft)

    def check(self, ticket: TransferTicket) -> None:
        """Refuse what this process cannot or must not read: another node, a GPU it does not
        see, or a hold near its end."""
        payload: DevicePayload = ticket.payload
        here = node_id()
        if payload.pools.node != here:
            raise TransferError(
                f"{self.name}: the KV is on node {payload.pools.node}, this worker runs on {here};"
                " use --kv-transfer ray across nodes"
            )
        age_s = time.time() - ticket.created_s
        if age_s > payload.hold_s / 2:
            raise TransferError(f"{self.name}: the hand-off is {age_s:.1f} s old; its slots may be freed")
        if not torch.cuda.is_available():
            raise TransferError(f"{self.name}: this worker has no GPU")
        index = payload.pools.device_index
        if index >= torch.cuda.device_count() or device_uuid(torch.device("cuda", index)) != payload.pools.device_uuid:
            raise TransferError(
                f"{self.name}: GPU {index} here is not the KV's GPU {payload.pools.device_uuid};"
                " both workers must see it under the same index"
            )

    def _map(
        self, pools: PoolHandles
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
        with self._lock:
            mapped = self._mapped.get(pools.producer_id)
            if mapped is None:
                target = (_open(pools.target[0]), _open(pools.target[1]))
                draft = None if pools.draft is None else (_open(pools.draft[0]), _open(pools.draft[1]))
                mapped = self._mapped[pools.producer_id] = (target, draft)
            return mapped

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream


def _open(shared: SharedTensor) -> torch.Tensor:
    rebuild, args = shared
    return rebuild(*args)
