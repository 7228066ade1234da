"""Logprobs as the OpenAI API reports them: from the raw model logits (log_softmax before
logit bias, penalties, temperature and filters), fixed shape with a host-known N."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    chosen: torch.Tensor  # [B] float32: logprob of the sampled token
    top_ids: torch.Tensor  # [B, N] int64, best first
    top_logprobs: torch.Tensor  # [B, N] float32, descending


def compute_logprobs(logits: torch.Tensor, tokens: torch.Tensor, num_top: int) -> TokenLogprobs:
    """`logits` [B, V] raw model output, `tokens` [B] chosen ids, `num_top` = N (host int,
    the largest `logprobs` requested in the batch; rows that asked for fewer slice on the
    host)."""
    if num_top < 0:
        raise ValueError(f"num_top must be >= 0, got {num_top}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    chosen = logprobs.gather(1, tokens.to(torch.int64)[:, None])[:, 0]
    top_logprobs, top_ids = torch.topk(logprobs, min(num_top, logprobs.shape[-1]), dim=-1)
    return TokenLogprobs(chosen=chosen, top_ids=top_ids, top_logprobs=top_logprobs)
