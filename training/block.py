"""The drafter's block forward, dense and differentiable, for many anchors per sequence.

For anchor position p of row b the block is `[x_p, mask x (gamma-1)]` at positions
`p .. p+gamma-1`; it attends to the context K/V of positions `[0, p)` (from the target's
captured hidden at those positions) and non-causally to itself. Block row i predicts the
token at p+1+i. This is the inference block at `seq_len = p` (engine.speculative.drafter.propose
after inject_kv of `[0, seq_len)`), computed for every anchor at once; a test compares the
two on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.models.context import ForwardContext
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.markov import MarkovBlock, markov_block
from training.dense_attention import ContextKV, DraftBlockAttention, dense_metadata


def block_offsets(anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """[B, A] -> [B, A, gamma]: the positions p + i of each block row."""
    return anchors[..., None] + torch.arange(gamma, device=anchors.device)


def draft_block_hidden(
    drafter: DSparkDrafter, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> torch.Tensor:
    """aux [B, S, K*H] captured target hidden, tokens [B, S] int64, anchors [B, A] int64 in
    [0, S) -> [B, A, gamma, H] the drafter's final-normed block hidden."""
    batch, seq_len = tokens.shape
    num_anchors = anchors.shape[1]
    gamma = drafter.config.gamma
    device = tokens.device
    positions = torch.arange(seq_len, device=device).repeat(batch)
    context_kv = drafter.context_kv(aux.flatten(0, 1), positions)  # per layer ([B*S, Hkv, D], same)
    ids = drafter.block_input_ids(tokens.gather(1, anchors).reshape(-1))  # [B*A, gamma]
    ctx = ForwardContext(
        meta=dense_metadata(batch * num_anchors, gamma, device, causal=False),
        kv=ContextKV(context_kv, batch),
        backend=DraftBlockAttention(anchors, seq_len, gamma),
    )
    hidden = drafter(ids.reshape(-1), block_offsets(anchors, gamma).reshape(-1), ctx)  # [B*A*gamma, H]
    return hidden.view(batch, num_anchors, gamma, -1)


def teacher_forced_steps(
    drafter: DSparkDrafter, base_logits: torch.Tensor, prev_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Markov-corrected logits with the true previous tokens (training).

    base_logits [..., gamma, V]; prev_tokens [..., gamma] (row i: the token at p+i, the
    anchor for i = 0) -> (step logits [..., gamma, V] float32, prev_embed [..., gamma, r])."""
    prev_embed = drafter.markov.embed_prev(prev_tokens)
    return base_logits.float() + drafter.markov.bias(prev_embed), prev_embed


def free_running_steps(
    drafter: DSparkDrafter,
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    temperature: torch.Tensor | None = None,
    gumbel: torch.Tensor | None = None,
) -> MarkovBlock:
    """The inference Markov loop (engine.speculative.markov.markov_block): each position conditioned
    on the token chosen before it. base_logits [N, gamma, V], anchor_tokens [N]; greedy unless
    a temperature [N] and Gumbel noise are given."""
    if temperature is None:
        temperature = torch.zeros(anchor_tokens.shape[0], device=anchor_tokens.device)
    return markov_block(base_logits.float(), anchor_tokens, drafter.markov, temperature, gumbel)


def base_logits(lm_head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [..., V] through the target's (shared) LM head."""
    return lm_head(hidden.flatten(0, -2)).view(*hidden.shape[:-1], -1)
