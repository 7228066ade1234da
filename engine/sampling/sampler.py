"""Token sampling: greedy, temperature, top-k / top-p / min-p, penalties, logit bias,
per-request seeds.

Order (vLLM's): raw logits -> logit bias -> penalties -> grammar mask (`processed_logits`,
what greedy takes the argmax of) -> temperature -> top-k / top-p / min-p -> draw. Logprobs
come from the raw logits (vLLM's default `raw_logprobs`).

Sampling is exact Gumbel-max in its exponential-race form: with E_v = -log(u_v) ~ Exp(1)
drawn by the counter-based generator (engine.sampling.rng), argmax_v p_v / E_v is v with
probability p_v / sum(p). `processed_probs` returns the very p that `Sampler.sample` draws
from, so DSpark's rejection sampler works with exactly the target's law.

Everything is fixed-shape device work with no host reads; the host only chooses code paths
from `SamplingFlags`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling import rng
from engine.sampling.filters import NEG_INF, apply_filters, apply_temperature, keep_sorted
from engine.sampling.grammar_mask import apply_token_bitmask
from engine.sampling.logprobs import TokenLogprobs, compute_logprobs
from engine.sampling.penalties import PenaltyState
from engine.sampling.rng import Stream
from engine.sampling.tensors import SamplingFlags, SamplingTensors

__all__ = [
    "SampleResult",
    "Sampler",
    "SamplingFlags",
    "SamplingTensors",
    "processed_logits",
    "processed_probs",
    "sample_from_probs",
    "sampling_law",
]


@dataclass(frozen=True)
class SampleResult:
    tokens: torch.Tensor  # [B] int64
    logprobs: TokenLogprobs | None = None  # when some row asked for logprobs


def sample_from_probs(probs: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, stream: int) -> torch.Tensor:
    """[B] int64 draws from `probs` [B, V] (non-negative, need not sum to 1: a residual
    max(p - q, 0) can go in as is). Row b draws from uniforms (key[b], counter[b], stream)."""
    exponential = rng.exponential(key, counter, probs.shape[-1], stream)  # [B, V]
    return (probs / exponential).argmax(dim=-1)


def processed_logits(
    logits: torch.Tensor,
    st: SamplingTensors,
    penalties: PenaltyState | None = None,
    rows: torch.Tensor | None = None,
    extra_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, V] float32: `logits` plus each row's logit bias, then penalised (vLLM applies the
    bias before the penalties), then masked by each grammar row's token bitmask. A new tensor
    whenever it differs: the raw logits stay intact for logprobs. `rows` [B] are the batch
    rows' PenaltyState rows; `extra_counts` [B, V] int32 counts tokens not yet committed
    (`PenaltyState.apply`)."""
    logits = logits.float()
    if st.logit_bias is not None:
        logits = st.logit_bias.apply(logits)
    if penalties is not None and st.flags.any_penalties:
        if rows is None:
            raise ValueError("penalties need `rows`, each batch row's row in the PenaltyState")
        logits = penalties.apply(logits, rows, st, extra_counts)
    if st.token_bitmask is not None:
        logits = apply_token_bitmask(logits, st.token_bitmask)
    return logits


def sampling_law(processed: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[B, V] the law each row samples from, given its `processed_logits`: temperature and
    filters, renormalised; one-hot at the argmax on greedy rows."""
    if st.flags.all_greedy:
        return torch.zeros_like(processed).scatter_(1, processed.argmax(dim=-1, keepdim=True), 1.0)
    probs = torch.softmax(apply_filters(apply_temperature(processed, st), st), dim=-1)
    if st.flags.any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, processed.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(st.greedy[:, None], one_hot, probs)
    return probs


def processed_probs(
    logits: torch.Tensor,
    st: SamplingTensors,
    penalties: PenaltyState | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, V] float32: the exact distribution `Sampler.sample` draws row b from (logit bias,
    penalties, temperature, filters, renormalised; one-hot at the argmax on greedy rows).

    A verify window [B, W, V] goes in flattened to [B*W, V] with `st.repeat_rows(W)`;
    its penalties should count the drafts before each row (`PenaltyState.apply(...,
    extra_counts=...)`)."""
    return sampling_law(processed_logits(logits, st, penalties, rows), st)


class Sampler:
    """Stateless; one per model runner.

    Batches whose sampled rows all use top-k may draw over the top max_top_k candidates only
    (each candidate sees the uniform the dense path would give it, so the token is the same).
    `sparse_top_k`: None chooses by size (K <= V / 4), True always when possible, False never.
    """

    def __init__(self, sparse_top_k: bool | None = None) -> None:
        self.sparse_top_k = sparse_top_k

    def processed_probs(
        self,
        logits: torch.Tensor,
        st: SamplingTensors,
        penalties: PenaltyState | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return processed_probs(logits, st, penalties, rows)

    def sample(
        self,
        logits: torch.Tensor,  # [B, V] raw model logits (any float dtype)
        st: SamplingTensors,
        counters: torch.Tensor,  # [B] int64: the position of the token being sampled
        penalties: PenaltyState | None = None,
        rows: torch.Tensor | None = None,  # [B] int64: each row's PenaltyState row
        *,
        stream: int = Stream.TARGET,
    ) -> SampleResult:
        flags = st.flags
        processed = processed_logits(logits, st, penalties, rows)
        if flags.all_greedy:
            tokens = processed.argmax(dim=-1)
        else:
            if self._use_sparse(flags, processed.shape[-1]):
                tokens = self._sample_top_k(processed, st, counters, stream)
            else:
                tokens = sample_from_probs(sampling_law(processed, st), st.key, counters, stream)
            if flags.any_greedy:
                tokens = torch.where(st.greedy, processed.argmax(dim=-1), tokens)
        logprobs = None
        if flags.max_logprobs is not None:
            logprobs = compute_logprobs(logits, tokens, flags.max_logprobs)
        return SampleResult(tokens=tokens, logprobs=logprobs)

    def _use_sparse(self, flags: SamplingFlags, vocab: int) -> bool:
        if not flags.all_top_k or self.sparse_top_k is False:
            return False
        # uniform_at evaluates a whole Philox block per candidate: worth it below V / 4.
        return self.sparse_top_k is True or 4 * flags.max_top_k <= vocab

    @staticmethod
    def _sample_top_k(
        processed: torch.Tensor, st: SamplingTensors, counters: torch.Tensor, stream: int
    ) -> torch.Tensor:
        """Gumbel-max over the top max_top_k candidates. Tokens outside them have p = 0, and
        each candidate sees the uniform the dense path would give it, so the draw is the same."""
        scaled = apply_temperature(processed, st)
        k = min(st.flags.max_top_k, scaled.shape[-1])
        candidate_logits, candidate_ids = torch.topk(scaled, k, dim=-1)  # [B, K]
        keep = keep_sorted(candidate_logits, st)
        probs = torch.softmax(candidate_logits.masked_fill(~keep, NEG_INF), dim=-1)
        exponential = -torch.log(rng.uniform_at(st.key, counters, candidate_ids, stream))
        choice = (probs / exponential).argmax(dim=-1, keepdim=True)
        return candidate_ids.gather(1, choice)[:, 0]
