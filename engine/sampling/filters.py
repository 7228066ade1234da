"""Temperature and the top-k / top-p / min-p filters, as fixed-shape masks.

Semantics (Hugging Face's warper order; vLLM agrees on top-k then top-p):
- top-k keeps the k highest-ranked tokens (exactly k; ties broken by sort order);
- top-p then keeps the shortest prefix, in descending probability, of the top-k-renormalised
  distribution whose mass reaches top_p (a token stays when the mass ranked strictly above
  it is < top_p, so the first token always stays);
- min-p keeps tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p) (the
  ratio, and so the set, is the same before or after renormalising).
A removed token gets logit -inf. Rows whose filter is off (top_k 0, top_p 1, min_p 0) are
untouched bit for bit.
"""

from __future__ import annotations

import torch

from engine.sampling.tensors import SamplingTensors

NEG_INF = float("-inf")


def apply_temperature(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[B, V] logits / temperature (greedy rows carry temperature 1)."""
    return logits / st.temperature[:, None]


def keep_sorted(sorted_logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[B, K] bool: which of the K best tokens survive, given their logits in descending
    order (K = V after a full sort, or K >= every row's top_k after torch.topk)."""
    rank = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)
    top_k = st.top_k[:, None]
    keep = (rank < top_k) | (top_k <= 0)
    if st.flags.any_top_p:
        probs = torch.softmax(sorted_logits.masked_fill(~keep, NEG_INF), dim=-1)
        mass_above = torch.cumsum(probs, dim=-1) - probs  # exactly 0 at rank 0
        top_p = st.top_p[:, None]
        keep = keep & ((mass_above < top_p) | (top_p >= 1.0))
    if st.flags.any_min_p:
        keep = keep & (sorted_logits >= sorted_logits[:, :1] + torch.log(st.min_p)[:, None])
    return keep


def apply_filters(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[B, V] temperature-scaled logits -> the same with filtered-out tokens at -inf."""
    flags = st.flags
    vocab = logits.shape[-1]
    if flags.any_top_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, order, keep_sorted(sorted_logits, st))
        return logits.masked_fill(~keep, NEG_INF)
    if flags.max_top_k > 0:
        k = min(flags.max_top_k, vocab)
        _, top_ids = torch.topk(logits, k, dim=-1)  # [B, k], descending
        rank = torch.arange(k, device=logits.device)
        in_top_k = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top_ids, rank < st.top_k[:, None])
        logits = logits.masked_fill(~(in_top_k | (st.top_k <= 0)[:, None]), NEG_INF)
    if flags.any_min_p:
        threshold = logits.amax(dim=-1, keepdim=True) + torch.log(st.min_p)[:, None]
        logits = logits.masked_fill(logits < threshold, NEG_INF)
    return logits
