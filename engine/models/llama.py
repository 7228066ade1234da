"""The Llama family: Llama 2/3, Mistral, SmolLM2, Qwen2 (q/k/v bias), Qwen3 (per-head q/k
RMSNorm before RoPE). GQA, RoPE with scaling, RMSNorm, SwiGLU, tied or untied LM head; the
differences are flags in `ModelConfig`, so one class serves them all.

Parameter names follow Hugging Face's (`model.layers.N.self_attn.o_proj.weight`), except that
q/k/v are fused into `qkv_proj` and gate/up into `gate_up_proj`; `load_weights` maps the
checkpoint's names onto those and each layer loads its tensor-parallel shard.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.config import ModelConfig
from engine.distributed.layers import (
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    SwiGLUParallelLinear,
    VocabParallelEmbedding,
    default_weight_loader,
)
from engine.kernels.linear import RowNorm
from engine.kernels.rope import RotaryAngles
from engine.models.context import LayerContext
from engine.models.layers import RMSNorm
from engine.models.registry import register_model
from engine.models.rotary import rotary_embedding


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            config.head_dim,
            config.num_heads,
            config.num_kv_heads,
            bias=config.attention_bias,
        )
        self.num_heads = self.qkv_proj.num_heads  # per rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads  # per rank
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.scale = config.head_dim**-0.5

    def forward(
        self, rope: RotaryAngles, hidden: torch.Tensor, norm: RowNorm, ctx: LayerContext
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (the attention's output [T, H], the residual stream)
        """Attention over `norm` applied to `hidden` (the layer's input norm, with the residual add
        before it, runs in the qkv projection's launch where a kernel takes both)."""
        qkv, residual = self.qkv_proj.normed(hidden, norm)  # [T, (Hq + 2 Hkv) * D] (this rank's heads)
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        # Strided views of qkv (row stride (Hq + 2 Hkv) * D): RoPE and the KV stores read them as is.
        q = q.unflatten(-1, (self.num_heads, self.head_dim))  # [T, Hq, D]
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))  # [T, Hkv, D]
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))  # [T, Hkv, D]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, k)
        out = ctx.attention(self.layer_id, q, k, v, self.scale)  # [T, Hq, D]
        return self.o_proj(out.flatten(1)), residual


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = SwiGLUParallelLinear(config.hidden_size, config.intermediate_size)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor, norm: RowNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP over `norm` applied to x, the residual stream), as LlamaAttention's."""
        gated, residual = self.gate_up_proj.normed(x, norm)
        return self.down_proj(gated), residual


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block, with the residual stream carried beside the branch output (vLLM's
    layout) so that each residual add fuses into the norm after it: the layer takes the
    previous layer's MLP output `hidden` and the stream `residual` before it was added, and
    returns the same pair. The stream after the layer is `hidden + residual`. Each norm is
    handed to the projection after it as a `RowNorm`, so that one kernel can do both."""

    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self,
        rope: RotaryAngles,  # RoPE at the forward's positions
        hidden: torch.Tensor,  # [T, H]: the previous layer's MLP output, or the embeddings
        residual: torch.Tensor | None,  # [T, H]: the stream before `hidden` joins it; None at layer 0
        ctx: LayerContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output, the stream before it)
        hidden, residual = self.self_attn(rope, hidden, self.input_layernorm.row_norm(residual), ctx)
        return self.mlp(hidden, self.post_attention_layernorm.row_norm(residual))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # One cos/sin cache; the forward gathers it at its positions once for every layer.
        self.rotary_emb = rotary_embedding(config)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, layer_id) for layer_id in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        rope = self.rotary_emb.at(positions)
        captured: dict[int, torch.Tensor] = {}
        residual: torch.Tensor | None = None
        for layer_id, layer in enumerate(self.layers):
            hidden, residual = layer(rope, hidden, residual, ctx)
            if layer_id in ctx.capture_layers:
                # The residual stream after this layer, [T, H]: materialised only here (one add
                # per captured layer); the next norm adds the same two tensors again, fused.
                captured[layer_id] = hidden + residual
        ctx.captured.extend(captured[layer_id] for layer_id in ctx.capture_layers)
        assert residual is not None  # ModelConfig has num_layers > 0
        return self.norm.add_and_norm(hidden, residual)[0]


# checkpoint projection name -> (our fused projection, shard id)
FUSED_PROJECTIONS = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_FUSED_SHARDS: dict[str, set[object]] = {"qkv_proj": {"q", "k", "v"}, "gate_up_proj": {0, 1}}
# Checkpoint entries that are not parameters (older HF checkpoints store the RoPE buffer).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


@register_model("llama", "mistral", "qwen2", "qwen3")
class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] int64 -> [T, H]."""
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        ctx: LayerContext,
        input_embeds: torch.Tensor | None = None,  # [T, H]: used instead of embedding input_ids
    ) -> torch.Tensor:  # [T, H], final norm applied
        hidden = self.embed(input_ids) if input_embeds is None else input_embeds
        return self.model(positions, hidden, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, H] -> [R, V] float32 (the full vocabulary on every rank)."""
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint tensors named as in Hugging Face checkpoints, each rank taking its
        shard. Raises ValueError on an unknown name or a shape mismatch, and if any parameter
        is left unloaded. Returns the parameter names loaded."""
        params = dict(self.named_parameters())
        shards: dict[str, set[object]] = {}
        for name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints store the shared matrix twice
            target, shard_id = name, None
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in FUSED_PROJECTIONS:
                fused, shard_id = FUSED_PROJECTIONS[parts[-2]]
                target = ".".join([*parts[:-2], fused, parts[-1]])
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(self).__name__}")
            module = self.get_submodule(target.rpartition(".")[0])
            loader = getattr(module, "weight_loader", default_weight_loader)
            loader(param, tensor, shard_id)
            shards.setdefault(target, set()).add(shard_id)
        missing = []
        for target in params:
            fused = target.split(".")[-2] if "." in target else ""
            need = _FUSED_SHARDS.get(fused, {None})
            got = shards.get(target, set())
            if not (None in got or need <= got):
                missing.append(target)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:4]}")
        return set(shards)
