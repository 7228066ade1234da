"""The KV transports by the name `--kv-transfer` takes (docs/design.md §5, §5.7)."""

from __future__ import annotations

from collections.abc import Callable

from services.workers.device_transfer import CudaIpcTransfer
from services.workers.transfer import InProcessTransfer, KVTransfer, RayObjectStoreTransfer

TRANSPORTS: dict[str, Callable[[], KVTransfer]] = {
    RayObjectStoreTransfer.name: RayObjectStoreTransfer,
    InProcessTransfer.name: InProcessTransfer,
    CudaIpcTransfer.name: CudaIpcTransfer,
}


def make_transfer(name: str) -> KVTransfer:
    try:
        return TRANSPORTS[name]()
    except KeyError:
        raise ValueError(f"kv_transfer: unknown transfer {name!r}; known: {sorted(TRANSPORTS)}") from None
