"""Verification of a DSpark block against the target (docs/design.md §3 "Verify", "Commit").

The target has run causally over the verify window `[anchor, d_0 .. d_{gamma-1}]`
(W = gamma + 1 rows per request); row j of its output predicts the token after row j's
input. Everything here is fixed-shape and free of host synchronisation:

- `out_tokens [B, W]` int64: the accepted drafts at columns `0 .. accept_len-2`, the bonus
  token at column `accept_len-1`, then -1. The host emits the first `accept_len` entries.
- `accept_len [B]` int32: tokens committed this step = accepted drafts + 1 bonus, in
  `[1, W]`. The anchor and the accepted drafts (verify rows `0 .. accept_len-1`) now have
  valid target KV; the bonus becomes the next step's anchor and has no KV yet.

Sampled acceptance is exact chain rejection sampling (Leviathan et al. 2023, "Fast
Inference from Transformers via Speculative Decoding"; Chen et al. 2023): draft d_i is
accepted with probability min(1, p_i(d_i) / q_i(d_i)); the first rejected position is
resampled from norm(max(p_i - q_i, 0)); if every draft passes, the bonus is drawn from
p_gamma. Each committed token then follows the target law p exactly, whatever q is, for
any processed p (penalties, temperature, top-k / top-p / min-p), as long as q is the law
the drafter actually sampled d_i from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling.rng import Stream, uniform

# Counter-based random streams (engine.sampling.rng): the same (key, counter) gives
# independent draws for the target sampler, the drafter and these two.
ACCEPT_COIN_STREAM = Stream.ACCEPT
ACCEPT_RESAMPLE_STREAM = Stream.RESIDUAL


@dataclass(frozen=True)
class AcceptResult:
    out_tokens: torch.Tensor  # [B, W] int64: committed tokens, then -1
    accept_len: torch.Tensor  # [B] int32: committed tokens per request, in [1, W]


def _out_tokens(draft_tokens: torch.Tensor, correct_len: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """[B, W]: drafts at columns < correct_len, the bonus at correct_len, -1 after."""
    batch, gamma = draft_tokens.shape
    cols = torch.arange(gamma + 1, device=draft_tokens.device)  # [W]
    padded = torch.cat([draft_tokens.long(), draft_tokens.new_full((batch, 1), -1).long()], dim=1)  # [B, W]
    cl = correct_len.long()[:, None]  # [B, 1]
    out = torch.where(cols < cl, padded, torch.full_like(padded, -1))
    return torch.where(cols == cl, bonus.long()[:, None], out)


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """[B, n] bool -> [B] int32: length of the all-true prefix of each row."""
    return mask.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)


def accept_greedy_from_argmax(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> AcceptResult:
    """draft_tokens [B, gamma], target_argmax [B, W] -> AcceptResult (see accept_greedy)."""
    gamma = draft_tokens.shape[1]
    _check_window(gamma, target_argmax.shape[1])
    correct_len = _leading_true(draft_tokens == target_argmax[:, :gamma])  # [B]
    bonus = target_argmax.gather(1, correct_len.long()[:, None]).squeeze(1)  # [B]
    return AcceptResult(_out_tokens(draft_tokens, correct_len, bonus), correct_len + 1)


def accept_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> AcceptResult:
    """Longest prefix where draft i equals argmax(target row i), plus the target's argmax at
    the first mismatch (row gamma if all match) as the bonus.

    draft_tokens [B, gamma] int64; target_logits [B, W, V] (after penalties; any monotone
    transform of them gives the same result).
    """
    return accept_greedy_from_argmax(draft_tokens, target_logits.argmax(dim=-1))


def acceptance_uniforms(key: torch.Tensor, counter: torch.Tensor, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws of one sampled acceptance: coin_u [B, gamma] (the accept tests) and
    resample_u [B] (draws the resampled or bonus token)."""
    coin_u = uniform(key, counter, gamma, ACCEPT_COIN_STREAM)
    resample_u = uniform(key, counter, 1, ACCEPT_RESAMPLE_STREAM)[:, 0]
    return coin_u, resample_u


def sample_categorical(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[B, V] non-negative, unnormalised weights and [B] uniforms in (0, 1) -> [B] int64
    index drawn with probability weights / weights.sum(), by inverting the CDF.

    One uniform per row (a Gumbel-max or exponential race needs V of them, which dominates
    the step on CPU). The CDF is accumulated in float64, so each token's probability is
    off by at most about 1e-16 from the float32 weights; the uniform's 2^-23 resolution
    is the limit. A token of zero weight is never drawn: it adds nothing to the CDF, and
    x = u * total lies strictly inside (0, total). Rows must have some mass.
    """
    cdf = weights.to(torch.float64).cumsum(dim=-1)  # [B, V]
    x = u.to(torch.float64)[:, None] * cdf[:, -1:]  # [B, 1]
    index = torch.searchsorted(cdf, x, right=True).squeeze(1)  # first v with cdf_v > x
    return index.clamp_(max=weights.shape[-1] - 1)


def chain_rejection(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    coin_u: torch.Tensor,
    resample_u: torch.Tensor,
) -> AcceptResult:
    """Chain rejection sampling with given uniforms.

    draft_tokens [B, gamma]; draft_probs q [B, gamma, V] (the law each d_i was drawn from);
    target_probs p [B, W, V]; coin_u [B, gamma] in [0, 1) and resample_u [B] in (0, 1).
    """
    batch, gamma = draft_tokens.shape
    _check_window(gamma, target_probs.shape[1])
    d = draft_tokens.long()[..., None]  # [B, gamma, 1]
    p_draft = target_probs[:, :gamma].gather(2, d).squeeze(2).float()  # [B, gamma]
    q_draft = draft_probs.gather(2, d).squeeze(2).float()  # [B, gamma]
    # u < p/q without dividing: q = 0 accepts iff p > 0 (min(1, p/0) = 1); p = 0 never accepts.
    accepted = coin_u.float() * q_draft < p_draft  # [B, gamma]
    correct_len = _leading_true(accepted)  # [B]

    vocab = target_probs.shape[2]
    row = correct_len.long()[:, None, None].expand(batch, 1, vocab)  # [B, 1, V]
    p_row = target_probs.gather(1, row).squeeze(1).float()  # [B, V]
    # Row gamma (all drafts accepted) has no draft: the bonus comes from p itself.
    q_row = draft_probs.gather(1, row.clamp(max=gamma - 1)).squeeze(1).float()  # [B, V]
    q_row = q_row * (correct_len < gamma)[:, None]
    residual = (p_row - q_row).clamp_min(0.0)  # [B, V]
    # Zero residual mass means p == q up to rounding (so rejection had probability 0): use p.
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    residual = torch.where(has_mass, residual, p_row)
    bonus = sample_categorical(residual, resample_u)  # [B]
    return AcceptResult(_out_tokens(draft_tokens, correct_len, bonus), correct_len + 1)


def accept_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    key: torch.Tensor,
    counter: torch.Tensor,
) -> AcceptResult:
    """Exact chain rejection sampling; randomness from (key [B], counter [B]) on the
    acceptance streams. draft_probs q [B, gamma, V]; target_probs p [B, W, V] from the
    engine's processed_probs (rows sum to 1)."""
    coin_u, resample_u = acceptance_uniforms(key, counter, draft_tokens.shape[1])
    return chain_rejection(draft_tokens, draft_probs, target_probs, coin_u, resample_u)


def accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_logits: torch.Tensor,
    target_probs: torch.Tensor,
    key: torch.Tensor,
    counter: torch.Tensor,
    greedy_mask: torch.Tensor,
) -> AcceptResult:
    """A mixed batch: rows with greedy_mask [B] True take accept_greedy(target_logits), the
    others accept_sampled(draft_probs, target_probs). Whatever greedy rows hold in the
    probability tensors is ignored. Use accept_greedy / accept_sampled directly when the
    host knows that the batch is all one kind."""
    greedy = accept_greedy(draft_tokens, target_logits)
    sampled = accept_sampled(draft_tokens, draft_probs, target_probs, key, counter)
    g = greedy_mask.to(torch.bool)
    return AcceptResult(
        out_tokens=torch.where(g[:, None], greedy.out_tokens, sampled.out_tokens),
        accept_len=torch.where(g, greedy.accept_len, sampled.accept_len),
    )


def draft_probs(draft_logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """q [B, gamma, V] float32: the law the drafter drew each token from, given its Markov
    step logits [B, gamma, V] and the request temperature [B]: softmax(logits / T), or
    one-hot at the argmax for greedy rows (T = 0)."""
    temp = temperature.float()[:, None, None]  # [B, 1, 1]
    greedy = temp <= 0
    logits = draft_logits.float()
    soft = torch.softmax(logits / torch.where(greedy, torch.ones_like(temp), temp), dim=-1)
    one_hot = torch.zeros_like(soft).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, soft)


def finalize(accept_len: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """new_seq_lens [B]: the anchor and the accepted drafts join the committed sequence.

    seq_lens counts tokens with KV before the verify (the anchor sits at position
    seq_lens); the bonus is not counted: it is the next anchor."""
    return seq_lens + accept_len.to(seq_lens.dtype)


def commit_slots(window_slots: torch.Tensor, accept_len: torch.Tensor) -> torch.Tensor:
    """[B, W] slots of the verify window with -1 at columns >= accept_len.

    Verify row j is the token at position seq_len + j (row 0 is the anchor); the target's
    hidden at row j belongs to that token. Rows 0 .. accept_len-1 (anchor + accepted
    drafts) are committed, so their captured hidden is KV-injected into the draft pool at
    these slots; rejected rows are skipped (-1), never compacted."""
    cols = torch.arange(window_slots.shape[1], device=window_slots.device)  # [W]
    keep = cols < accept_len.long()[:, None]  # [B, W]
    return torch.where(keep, window_slots, torch.full_like(window_slots, -1))


def _check_window(gamma: int, window: int) -> None:
    if window != gamma + 1:
        raise ValueError(f"the verify window must hold gamma + 1 = {gamma + 1} rows per request, got {window}")
