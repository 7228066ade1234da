"""Host -> device copies that never block the host (docs/design.md §4): stage in pinned memory,
copy with `non_blocking=True`."""

from __future__ import annotations

from typing import Protocol

import torch


class PinnedPool(Protocol):
    """Hands out pinned host buffers that no in-flight copy still reads."""

    def buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat pinned CPU tensor of at least `numel` elements of `dtype`."""
        ...


def upload(host: torch.Tensor, device: torch.device, pinned_pool: PinnedPool | None = None) -> torch.Tensor:
    """Copy the CPU tensor `host` to `device` without waiting for the device.

    Without a pool the staging buffer comes from torch's caching pinned allocator, which
    keeps a block out of reuse until the copy that reads it has finished. On a CPU device
    `host` itself is returned (the caller hands it over and must not write it afterwards).
    """
    if device.type == "cpu":
        return host
    if pinned_pool is None:
        staging = host.pin_memory()
    else:
        staging = pinned_pool.buffer(host.numel(), host.dtype)[: host.numel()].view(host.shape)
        staging.copy_(host)
    return staging.to(device, non_blocking=True)
