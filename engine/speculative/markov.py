"""DSpark's semi-autoregressive tail: the Markov head, the block sampler and the confidence
head (docs/design.md §3 "Drafting a block").

The drafter's one block forward gives base logits for all gamma positions in parallel; the
Markov head then corrects position i with a low-rank bigram bias from the token chosen at
i-1 (the anchor at i = 0), `bias(prev) = w1[prev] @ w2` with `w1 [V, r]`, `w2 [r, V]`.
The loop over i is sequential, but each step is only a [B, r] x [r, V] GEMV plus an argmax
(greedy rows) or a one-uniform inverse-CDF draw (sampled rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.speculative.accept import sample_categorical


class MarkovHead(nn.Module):
    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.rank = rank
        self.w1 = nn.Parameter(torch.empty(vocab_size, rank))  # [V, r]: previous token -> r
        self.w2 = nn.Parameter(torch.empty(rank, vocab_size))  # [r, V]: r -> logit bias
        nn.init.normal_(self.w1, std=rank**-0.5)
        nn.init.zeros_(self.w2)  # an untrained head adds nothing to the base logits

    def embed_prev(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """[...] int64 -> [..., r]."""
        return F.embedding(prev_tokens, self.w1)

    def bias(self, prev_embed: torch.Tensor) -> torch.Tensor:
        """[..., r] -> [..., V] float32."""
        return (prev_embed @ self.w2).float()


class ConfidenceHead(nn.Module):
    """P(draft i is accepted) from `[h_i ; w1[prev_i]]`: one linear layer and a sigmoid."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1)

    def logit(self, hidden: torch.Tensor, prev_embed: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], prev_embed [..., r] -> [...] float32 (pre-sigmoid)."""
        return self.proj(torch.cat([hidden, prev_embed.to(hidden.dtype)], dim=-1)).squeeze(-1).float()

    def forward(self, hidden: torch.Tensor, prev_embed: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logit(hidden, prev_embed))


@dataclass(frozen=True)
class MarkovBlock:
    draft_tokens: torch.Tensor  # [B, gamma] int64
    step_logits: torch.Tensor  # [B, gamma, V] float32: base + bias(prev)
    prev_embed: torch.Tensor  # [B, gamma, r]: w1 of the token before each position


def markov_block(
    base_logits: torch.Tensor,  # [B, gamma, V] float32
    anchor: torch.Tensor,  # [B] int64
    head: MarkovHead,
    temperature: torch.Tensor,  # [B]; <= 0 means greedy
    uniforms: torch.Tensor | None,  # [B, gamma] in (0, 1), one per position; None: all greedy
) -> MarkovBlock:
    """Choose the block's tokens left to right. Greedy rows take argmax(step logits); the
    others draw from softmax(step / T) by inverting its CDF with their uniform, an exact
    draw from that law (the q that acceptance divides by) at one random number per
    position, where a Gumbel-max draw would need V of them."""
    batch, gamma, vocab = base_logits.shape
    step_logits = torch.empty_like(base_logits, dtype=torch.float32)
    prev_embed = base_logits.new_empty(batch, gamma, head.rank, dtype=head.w1.dtype)
    draft_tokens = torch.empty(batch, gamma, dtype=torch.int64, device=base_logits.device)
    temp = temperature.float()[:, None]  # [B, 1]
    greedy = temp <= 0
    safe_temp = torch.where(greedy, torch.ones_like(temp), temp)
    prev = anchor.long()
    for i in range(gamma):
        embed = head.embed_prev(prev)  # [B, r]
        step = base_logits[:, i].float() + head.bias(embed)  # [B, V]
        choice = step.argmax(dim=-1)
        if uniforms is not None:
            sampled = sample_categorical(torch.softmax(step / safe_temp, dim=-1), uniforms[:, i])
            choice = torch.where(greedy[:, 0], choice, sampled)
        step_logits[:, i] = step
        prev_embed[:, i] = embed
        draft_tokens[:, i] = choice
        prev = choice
    return MarkovBlock(draft_tokens, step_logits, prev_embed)
