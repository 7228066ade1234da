"""What a model asks of attention: store the forward's new K/V in the paged cache, then
attend every query row to its request's keys (engine.kernels.attention_metadata says which).

TorchAttentionBackend and TritonAttentionBackend implement it (engine.attention.select_backend
picks one); training's dense attention does too."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.kernels.attention_metadata import AttentionMetadata


class AttentionBackend(Protocol):
    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D] new keys (RoPE applied)
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]; the last row is a write sink
        v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,  # [T, Hq, D]: written and returned when given
    ) -> torch.Tensor:  # [T, Hq, D]
        """Store k/v at meta.out_slots, then attend (see AttentionMetadata)."""
        ...
