"""Device KV pools: one tensor pair per layer, indexed by slot id.

Shape per layer: `[num_slots + 1, Hkv, D]`. Row `num_slots` is a write sink: a slot id of -1
(skip) lands there through negative indexing, so scatters never need a mask. The target
pool and the DSpark draft pool are two `KVPool`s over the same slot-id space.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (num_layers, num_slots + 1, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer_id], self.v[layer_id]

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def slot_bytes(self) -> int:
        """Bytes of K and V one slot holds across the layers."""
        return 2 * self.k[0, 0].numel() * self.k.element_size() * self.num_layers

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """[L, 2, n, Hkv, D]: the K/V of `slots` (a copy), for handing a request to another engine."""
        return gather_slots(self.k, self.v, slots)

    def write(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Inverse of `read`: kv is [L, 2, n, Hkv, D]."""
        self.k[:, slots] = kv[:, 0].to(self.k.dtype)
        self.v[:, slots] = kv[:, 1].to(self.v.dtype)


def gather_slots(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[L, 2, n, Hkv, D] from pools k, v [L, S, Hkv, D] at `slots` [n] int64 (same device).
    One pass over the bytes: each layer's rows land straight in their contiguous block of the
    output (an indexed read of the whole pool and a stack would pass over them twice)."""
    out = torch.empty((k.shape[0], 2, slots.numel(), *k.shape[2:]), dtype=k.dtype, device=k.device)
    for layer in range(k.shape[0]):
        torch.index_select(k[layer], 0, slots, out=out[layer, 0])
        torch.index_select(v[layer], 0, slots, out=out[layer, 1])
    return out
