"""The DSpark drafter (docs/design.md §3): a few Qwen3-style layers that draft a block of gamma
tokens in one non-causal forward, reading the target's hidden states through KV injection.

Data flow per decode step (B requests, block rows laid `[B, gamma]`):

    inject_kv(aux [N, K*H]) -> fc -> hidden_norm -> context [N, H]
        -> one stacked GEMM: every layer's [k | v] [N, L * 2*Hkv*D]
        -> per layer: k_norm + RoPE(position) + scatter into the draft pool at the slot
    propose(anchor [B]) -> ids [anchor, mask x (gamma-1)] -> shared embedding
        -> L layers (attend non-causally to context KV [0, seq_len) plus the block)
        -> final norm -> shared LM head: base logits [B, gamma, V]
        -> Markov loop (engine.speculative.markov): draft tokens, step logits, confidence

The context vectors never run through the layers: each layer's K/V for a context token is
its own k/v projection of the context vector (with its k_norm and RoPE), exactly what the
block computes for a block token from its normed hidden state. The embedding and LM head
are the target's (`bind_target`), not parameters of the drafter. The drafter is small and
replicated on every tensor-parallel rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import silu_and_mul
from engine.kernels.cpu.linear import PackableLinear
from engine.kernels.kv_inject import inject_layer_kv
from engine.models.context import ForwardContext, KVCaches
from engine.models.layers import RMSNorm, RotaryEmbedding
from engine.models.rotary import rotary_embedding
from engine.sampling.rng import Stream, uniform
from engine.speculative.drafter_config import DrafterConfig
from engine.speculative.markov import ConfidenceHead, MarkovHead, markov_block

DRAFT_STREAM = Stream.DRAFT  # distinct from the target sampler's and the acceptance streams
TensorFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Proposal:
    draft_tokens: torch.Tensor  # [B, gamma] int64
    # [B, gamma, V] float32, the Markov-corrected step logits: the draft law of a sampled
    # row is softmax(draft_logits / T) (engine.speculative.accept.draft_probs); greedy rows took
    # the argmax.
    draft_logits: torch.Tensor
    confidence: torch.Tensor | None  # [B, gamma] float32 in [0, 1]; None without the head


class DrafterAttention(nn.Module):
    """GQA with per-head q/k RMSNorm and RoPE. The k/v weights live in the drafter's
    stacked `kv_proj` (so KV injection is one GEMM for all layers) and are passed in."""

    k_norm: RMSNorm

    def __init__(self, config: DrafterConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = PackableLinear(config.hidden_size, config.q_size, bias=False)
        self.o_proj = PackableLinear(config.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.scale = config.head_dim**-0.5

    def project_kv(
        self, x: torch.Tensor, kv_weight: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (k [T, Hkv, D] normed and rotated, v [T, Hkv, D]): the one definition of
        a token's K/V, for block tokens (from their normed hidden) and context tokens (from
        their context vector)."""
        k, v = F.linear(x, kv_weight).unflatten(-1, (2, self.num_kv_heads, self.head_dim)).unbind(1)
        _, k = rotary(positions, k[:, :0], self.k_norm(k))  # RoPE on k alone (a q with no heads)
        return k, v.contiguous()

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_weight: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)))  # [T, Hq, D]
        q, _ = rotary(positions, q, q[:, :0])
        k, v = self.project_kv(x, kv_weight, positions, rotary)  # [T, Hkv, D]
        out = ctx.attention(self.layer_id, q, k, v, self.scale)  # [T, Hq, D]
        return self.o_proj(out.flatten(1))


class DrafterLayer(nn.Module):
    self_attn: DrafterAttention

    def __init__(self, config: DrafterConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DrafterAttention(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_up_proj = PackableLinear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = PackableLinear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,  # [T, H]: the previous layer's MLP output, or the embeddings
        residual: torch.Tensor | None,  # [T, H]: the stream before `hidden` joins it; None at layer 0
        kv_weight: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output, the stream before it)
        """Pre-norm block with the residual carried beside the branch output, so each residual
        add fuses into the norm after it (as engine.models.llama.LlamaDecoderLayer)."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_weight, rotary, ctx)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
        return self.down_proj(silu_and_mul(self.gate_up_proj(hidden))), residual


class DSparkDrafter(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        hidden, num_layers = config.hidden_size, config.num_layers
        self.fc = PackableLinear(config.num_capture_layers * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        # [L, 2*Hkv*D, H]: rows [k heads | v heads] of every layer, one GEMM for injection.
        self.kv_proj = nn.Parameter(torch.empty(num_layers, 2 * config.kv_size, hidden))
        nn.init.normal_(self.kv_proj, std=hidden**-0.5)
        self.layers = nn.ModuleList(DrafterLayer(config, i) for i in range(num_layers))
        self._layer_list: list[DrafterLayer] = list(self.layers)  # type: ignore[arg-type]  # typed view
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.rotary_emb = rotary_embedding(config)
        self.markov = MarkovHead(config.vocab_size, config.markov_rank)
        self.confidence = ConfidenceHead(hidden, config.markov_rank) if config.confidence_head else None
        # The target's modules, held in a tuple so they are neither parameters nor submodules.
        self._shared: tuple[TensorFn, TensorFn] | None = None

    # ---- binding -------------------------------------------------------------------------

    def bind_target(self, embed: TensorFn, lm_head: TensorFn) -> None:
        """Share the target's embedding (`[T] int64 -> [T, H]`) and LM head
        (`[R, H] -> [R, V]`, full vocabulary), e.g. `target.embed`, `target.compute_logits`."""
        self._shared = (embed, lm_head)

    def _target_modules(self) -> tuple[TensorFn, TensorFn]:
        if self._shared is None:
            raise RuntimeError("DSparkDrafter: call bind_target(embed, lm_head) before drafting")
        return self._shared

    # ---- context: the target's hidden states -------------------------------------------

    def context(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """[N, K*H] captured target residual streams -> [N, H] context vectors."""
        return self.hidden_norm(self.fc(aux_hidden.to(self.fc.weight.dtype)))

    def context_kv(self, aux_hidden: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (k, v) [N, Hkv, D] for context tokens, with the block path's own
        modules (differentiable; training and the dense reference). inject_kv stores the same."""
        context = self.context(aux_hidden)
        return [
            layer.self_attn.project_kv(context, self.kv_proj[i], positions, self.rotary_emb)
            for i, layer in enumerate(self._layer_list)
        ]

    @torch.no_grad()
    def inject_kv(
        self,
        aux_hidden: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv_caches: KVCaches,
        use_triton: bool | None = None,
    ) -> None:
        """KV injection. aux_hidden [N, K*H], positions [N] int64, slots [N] (-1 skips the
        token); kv_caches is the draft pool (layer i -> [num_slots + 1, Hkv, D] k and v).
        Prefill injects every new token; a decode step injects the verify window's rows
        with engine.speculative.accept.commit_slots. The Triton kernel runs on GPU."""
        context = self.context(aux_hidden)  # [N, H]
        kv_all = F.linear(context, self.kv_proj.flatten(0, 1))  # [N, L * 2*Hkv*D]
        cos, sin = self.rotary_emb.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)  # [N, half]
        width = 2 * self.config.kv_size
        for i, layer in enumerate(self._layer_list):
            k_cache, v_cache = kv_caches.layer(i)
            inject_layer_kv(
                kv_all[:, i * width : (i + 1) * width],
                layer.self_attn.k_norm.weight,
                self.config.rms_norm_eps,
                cos,
                sin,
                slots,
                k_cache,
                v_cache,
                use_triton,
            )

    # ---- the block -----------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """input_ids, positions [T] -> [T, H] final-normed hidden (attention through ctx)."""
        embed, _ = self._target_modules()
        hidden = embed(input_ids).to(self.fc.weight.dtype)
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self._layer_list):
            hidden, residual = layer(positions, hidden, residual, self.kv_proj[i], self.rotary_emb, ctx)
        assert residual is not None  # DrafterConfig has num_layers > 0
        return self.norm.add_and_norm(hidden, residual)[0]

    def block_input_ids(self, anchor: torch.Tensor) -> torch.Tensor:
        """[B] -> [B, gamma]: the anchor, then the mask token."""
        ids = anchor.new_full((anchor.shape[0], self.config.gamma), self.config.mask_token_id)
        ids[:, 0] = anchor
        return ids

    @torch.no_grad()
    def propose(
        self,
        anchor: torch.Tensor,  # [B] int64: the last committed (bonus) token, at position seq_len
        ctx: ForwardContext,  # the block: uniform_extend = gamma, causal = False
        positions: torch.Tensor,  # [B, gamma] int64: seq_len + [0, gamma)
        temperature: torch.Tensor,  # [B] float; 0 = greedy
        key: torch.Tensor,  # [B] int64
        counter: torch.Tensor,  # [B] int64
        any_sampled: bool = True,  # host-known: False skips the random draws (all rows greedy)
    ) -> Proposal:
        """Draft gamma tokens per request. ctx.kv is the draft pool and ctx.meta.out_slots the
        first gamma slots of each request's verify window: the block's own K/V land there,
        the commit injection then overwrites the committed columns with context K/V, and the
        rejected ones lie past the new length (never read, overwritten next step)."""
        gamma, batch = self.config.gamma, anchor.shape[0]
        meta = ctx.meta
        if meta.causal or meta.uniform_extend != gamma or meta.num_tokens != batch * gamma:
            raise ValueError(
                f"propose needs a non-causal block of {batch} x gamma={gamma} rows, got "
                f"causal={meta.causal}, uniform_extend={meta.uniform_extend}, "
                f"num_tokens={meta.num_tokens}"
            )
        hidden = self(self.block_input_ids(anchor).reshape(-1), positions.reshape(-1), ctx)  # [B*gamma, H]
        _, lm_head = self._target_modules()
        base_logits = lm_head(hidden).float().view(batch, gamma, -1)  # [B, gamma, V]
        uniforms = uniform(key, counter, gamma, DRAFT_STREAM) if any_sampled else None  # [B, gamma]
        block = markov_block(base_logits, anchor, self.markov, temperature, uniforms)
        confidence = None
        if self.confidence is not None:
            confidence = self.confidence(hidden.view(batch, gamma, -1), block.prev_embed)
        return Proposal(block.draft_tokens, block.step_logits, confidence)
