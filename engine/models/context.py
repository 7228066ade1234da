"""The per-forward context a model reads: attention metadata, the KV pool, the attention
backend (engine.attention.backend.AttentionBackend), and which layers' residual streams to
capture (DSpark reads them). A model sees only `LayerContext`: its layers call `attention`
and fill `captured`, so a forward can also run under a context that is not a step's own
(engine/runner/piecewise_graphs.py captures one that way)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.attention.backend import AttentionBackend
from engine.kernels.attention_metadata import AttentionMetadata


class KVCaches(Protocol):
    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache) of one layer, each [num_slots + 1, Hkv, D]."""
        ...


class LayerContext(Protocol):
    capture_layers: tuple[int, ...]  # residual stream *after* these layers is captured
    captured: list[torch.Tensor]  # filled in capture order

    def attention(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, Hq, D] (after RoPE), k/v [T, Hkv, D] -> [T, Hq, D]; stores k/v in the layer's KV.
        `out` [T, Hq, D]: where the result goes (and what is returned), if given."""
        ...


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    kv: KVCaches
    backend: AttentionBackend
    capture_layers: tuple[int, ...] = ()  # residual stream *after* these layers is captured
    captured: list[torch.Tensor] = field(default_factory=list)  # filled in capture order

    def attention(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        k_cache, v_cache = self.kv.layer(layer_id)
        return self.backend.forward(q, k, v, k_cache, v_cache, self.meta, scale, out=out)

    def aux_hidden(self) -> torch.Tensor | None:
        """[T, K*H]: the captured residual streams concatenated per token, or None."""
        if not self.capture_layers:
            return None
        return torch.cat(self.captured, dim=-1)


class CausalLM(Protocol):
    """What the runners and the drafter need of a target model (every registered family,
    e.g. engine.models.llama.LlamaForCausalLM, has this shape)."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """input_ids [T], positions [T] -> final hidden states [T, H] (after the last norm)."""
        ...

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [R, H] -> [R, V]
        ...
