"""Host → device copies that never block the host.

On an accelerator the host array is staged in pinned memory and copied with
`non_blocking=True`; the caching host allocator keeps the pinned block alive until the copy
has run, so the host may reuse its numpy array at once. On CPU the copy is a plain copy.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return host.clone()
    return host.pin_memory().to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, array: np.ndarray) -> None:
    """dst[...] = array, without blocking the host. dst's shape must match."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if dst.device.type == "cpu":
        dst.copy_(host)
    else:
        dst.copy_(host.pin_memory(), non_blocking=True)
