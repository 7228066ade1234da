"""Write the new tokens' keys and values into the paged KV cache.

`k_cache, v_cache: [num_slots + 1, Hkv, D]`; token t goes to row `out_slots[t]`. Slot -1
means "skip": the torch reference here writes it into the last row (a sink nobody reads, which
is what negative indexing does), the Triton kernel (engine/kernels/triton/store_kv.py) does not
write it at all; the C kernel of the CPU attention binding (engine/kernels/cpu/attention.py)
skips it too. `store_kv` picks the Triton kernel or the reference.
"""

from __future__ import annotations

import torch

from engine.kernels.triton import launch
from engine.kernels.triton.store_kv import store_kv_triton


def store_kv_torch(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    out_slots: torch.Tensor,  # [T] int64, -1 = skip (lands in the sink row)
) -> None:
    """Reference: one index_put per cache. Sync-free (no host read of `out_slots`)."""
    k_cache[out_slots] = k.to(k_cache.dtype)
    v_cache[out_slots] = v.to(v_cache.dtype)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_slots: torch.Tensor,
) -> None:
    """Store with the Triton kernel on GPU (when triton is installed), else with torch."""
    if k_cache.is_cuda and launch.available():
        store_kv_triton(k, v, k_cache, v_cache, out_slots)
    else:
        store_kv_torch(k, v, k_cache, v_cache, out_slots)
