"""Token sampling: greedy, temperature, top-k / top-p / min-p, penalties, per-request seeds.

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
from engine.sampling.logprobs import TokenLogprobs, compute_logprobs
from engine.sampling.penalties import PenaltyState
from engine.sampling.rng import Stream
from engine.sampling.tensors import SamplingFlags, SamplingTensors

__all__ = [
    "SampleResult",
    "Sampler",
    "SamplingFlags",
    "SamplingTensors",
    "processed_probs",
    "sample_from_probs",
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


def _penalised(
    logits: torch.Tensor, st: SamplingTensors, penalties: PenaltyState | None, rows: torch.Tensor | None
) -> torch.Tensor:
    logits = logits.float()
    if penalties is not None and st.flags.any_penalties:
        if rows is None:
            raise ValueError("penalties need `rows`, each batch row's row in the PenaltyState")
        logits = penalties.apply(logits, rows, st)
    return logits


def _probs(penalised: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[B, V] the sampling law of each row from its penalised logits."""
    if st.flags.all_greedy:
        return torch.zeros_like(penalised).scatter_(1, penalised.argmax(dim=-1, keepdim=True), 1.0)
    probs = torch.softmax(apply_filters(apply_temperature(penalised, st), st), dim=-1)
    if st.flags.any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, penalised.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(st.greedy[:, None], one_hot, probs)
    return probs


def processed_probs(
    logits: torch.Tensor,
    st: SamplingTensors,
    penalties: PenaltyState | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, V] float32: the exact distribution `Sampler.sample` draws row b from (penalties,
    temperature, filters, renormalised; one-hot at the argmax on greedy rows).

    A verify window [B, W, V] goes in flattened to [B*W, V] with `st.gather(arange(B*W) // W)`;
    its penalties should count the drafts before each row (`PenaltyState.apply(...,
    extra_counts=...)`)."""
    return _probs(_penalised(logits, st, penalties, rows), st)


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
        penalised = _penalised(logits, st, penalties, rows)
        if flags.all_greedy:
            tokens = penalised.argmax(dim=-1)
        else:
            if self._use_sparse(flags, penalised.shape[-1]):
                tokens = self._sample_top_k(penalised, st, counters, stream)
            else:
                tokens = sample_from_probs(_probs(penalised, st), st.key, counters, stream)
            if flags.any_greedy:
                tokens = torch.where(st.greedy, penalised.argmax(dim=-1), tokens)
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
        penalised: torch.Tensor, st: SamplingTensors, counters: torch.Tensor, stream: int
    ) -> torch.Tensor:
        """Gumbel-max over the top max_top_k candidates. Tokens outside them have p = 0, and
        each candidate sees the uniform the dense path would give it, so the draw is the same."""
        scaled = apply_temperature(penalised, st)
        k = min(st.flags.max_top_k, scaled.shape[-1])
        candidate_logits, candidate_ids = torch.topk(scaled, k, dim=-1)  # [B, K]
        keep = keep_sorted(candidate_logits, st)
        probs = torch.softmax(candidate_logits.masked_fill(~keep, NEG_INF), dim=-1)
        exponential = -torch.log(rng.uniform_at(st.key, counters, candidate_ids, stream))
        choice = (probs / exponential).argmax(dim=-1, keepdim=True)
        return candidate_ids.gather(1, choice)[:, 0]
