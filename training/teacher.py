"""The target as teacher: one no-grad forward over a batch of padded sequences, capturing the
residual streams the drafter reads, plus the target's own next-token predictions.

Row b of a batch holds `lengths[b]` real tokens, then padding. Position s of the target's
output predicts the token at s + 1 from tokens `[0, s]`, the same value the engine's causal
prefill or verify forward gives at that position (docs/design.md §3: the draft context KV of a
token is built from exactly this captured hidden).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.models.context import ForwardContext
from training.dense_attention import CausalRowsAttention, NoCache, dense_metadata

ARGMAX_CHUNK_ROWS = 4096  # rows of [rows, V] logits materialised at once


@dataclass
class TeacherOutput:
    target: nn.Module  # for compute_logits
    tokens: torch.Tensor  # [B, S] int64
    lengths: torch.Tensor  # [B] int64
    aux: torch.Tensor  # [B, S, K*H] the captured residual streams (target dtype)
    hidden: torch.Tensor  # [B, S, H] final-normed hidden of every position

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    @torch.no_grad()
    def logits_at(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [B, ...] int64 (clamped into the row) -> [B, ..., V] float32: the target's
        logits at those positions, i.e. its distribution of the next token."""
        index = positions.clamp(0, self.seq_len - 1)
        rows = torch.arange(self.batch, device=index.device).view(-1, *([1] * (index.dim() - 1)))
        hidden = self.hidden[rows.expand_as(index), index]  # [B, ..., H]
        return self.target.compute_logits(hidden.flatten(0, -2)).float().view(*index.shape, -1)  # type: ignore[operator]

    @torch.no_grad()
    def argmax_all(self) -> torch.Tensor:
        """[B, S] int64: the target's greedy next token after every position."""
        flat = self.hidden.flatten(0, 1)
        out = torch.empty(flat.shape[0], dtype=torch.int64, device=flat.device)
        for start in range(0, flat.shape[0], ARGMAX_CHUNK_ROWS):
            chunk = flat[start : start + ARGMAX_CHUNK_ROWS]
            out[start : start + chunk.shape[0]] = self.target.compute_logits(chunk).argmax(dim=-1)  # type: ignore[operator]
        return out.view(self.batch, self.seq_len)


@torch.no_grad()
def run_teacher(
    target: nn.Module, capture_layers: tuple[int, ...], tokens: torch.Tensor, lengths: torch.Tensor
) -> TeacherOutput:
    """tokens [B, S] int64 right-padded (any id past a row's length), lengths [B]."""
    batch, seq_len = tokens.shape
    device = tokens.device
    ctx = ForwardContext(
        meta=dense_metadata(batch, seq_len, device),
        kv=NoCache(),
        backend=CausalRowsAttention(batch),
        capture_layers=capture_layers,
    )
    positions = torch.arange(seq_len, device=device).repeat(batch)
    hidden = target(tokens.reshape(-1), positions, ctx)  # [B*S, H]
    aux = ctx.aux_hidden()
    if aux is None:
        raise ValueError("run_teacher needs at least one capture layer")
    return TeacherOutput(
        target=target,
        tokens=tokens,
        lengths=lengths.to(device),
        aux=aux.view(batch, seq_len, -1),
        hidden=hidden.view(batch, seq_len, -1),
    )
