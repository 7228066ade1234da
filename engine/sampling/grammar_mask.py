"""Applying a grammar's token bitmask to logits on the device (docs/design.md §2.8): fixed
shapes, no host sync; rows whose mask allows every token are unchanged."""

from __future__ import annotations

import torch


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """`logits` [..., V] with −inf where `bitmask` [..., words] int32 has a 0 bit (bit
    `t % 32` of word `t // 32` allows token t). Leading dims of the two must match."""
    vocab = logits.shape[-1]
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool()  # [..., words, 32]
    allowed = allowed.flatten(-2)[..., :vocab]  # [..., V]
    return logits.masked_fill(~allowed, float("-inf"))
