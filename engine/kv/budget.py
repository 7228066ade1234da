"""How many bytes the KV pool gets. engine/engine_setup.py measures the memory; this decides.

- `kv_cache_memory_bytes`: exactly that.
- GPU with `gpu_memory_utilization` u: the weights and the KV pool together take u of the
  memory free when the engine started (F0). The weights take what free memory dropped by
  while the model and its drafter loaded (F0 - F1), so the pool gets u*F0 - (F0 - F1).
  Weights already in memory before the engine started are not part of F0 and not counted.
- GPU otherwise: `kv_memory_fraction` of the memory free once the weights are in (F1).
- CPU: an eighth of the RAM, at most 2 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig

CPU_KV_CAP_BYTES = 2 << 30
_GIB = float(1 << 30)


@dataclass(frozen=True)
class DeviceMemory:
    """Free bytes on the engine's GPU, as `torch.cuda.mem_get_info` reports them with the
    allocator's cache emptied."""

    free_at_start: int  # before the engine loaded any weights
    free_after_weights: int  # once the model and its drafter are in


def kv_budget_for_utilization(utilization: float, memory: DeviceMemory) -> int:
    """Bytes left for the KV pool when weights + KV may take `utilization` of the memory free at
    start; ValueError when the weights alone take that share."""
    weights = max(0, memory.free_at_start - memory.free_after_weights)
    share = int(utilization * memory.free_at_start)
    budget = min(share - weights, memory.free_after_weights)
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization {utilization} allows {share / _GIB:.2f} GiB of the "
            f"{memory.free_at_start / _GIB:.2f} GiB free at start, and the weights took {weights / _GIB:.2f} GiB: "
            "nothing is left for the KV cache; raise gpu_memory_utilization"
        )
    return budget


def kv_budget_bytes(config: EngineConfig, memory: DeviceMemory | None, ram_bytes: int) -> int:
    """The KV pool's bytes; `memory` is None on CPU, where `ram_bytes` is the machine's RAM."""
    if config.kv_cache_memory_bytes:
        return config.kv_cache_memory_bytes
    if memory is None:
        if config.gpu_memory_utilization is not None:
            raise ValueError(
                "gpu_memory_utilization sizes the KV pool from GPU memory, and this engine runs on CPU; "
                "size it with kv_cache_memory_bytes"
            )
        return min(CPU_KV_CAP_BYTES, ram_bytes // 8)
    if config.gpu_memory_utilization is not None:
        return kv_budget_for_utilization(config.gpu_memory_utilization, memory)
    return int(memory.free_after_weights * config.kv_memory_fraction)
