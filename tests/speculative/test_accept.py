"""Greedy and sampled acceptance: constructed cases, agreement with a NumPy statement of the
algorithm, and exactness: the committed tokens follow the target law p (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from accept_reference import chain_rejection_numpy
from scipy import stats
from spec_helpers import sync_guard

from engine.sampling.rng import Stream, uniform
from engine.speculative.accept import (
    accept,
    accept_greedy,
    accept_sampled,
    acceptance_uniforms,
    chain_rejection,
    commit_slots,
    draft_probs,
    finalize,
    sample_categorical,
)
from engine.speculative.markov import MarkovHead, markov_block

P_VALUE_FLOOR = 1e-3


def one_hot_logits(tokens: list[list[int]], vocab: int) -> torch.Tensor:
    """[B, W, V] logits whose argmax at row j is tokens[b][j]."""
    t = torch.tensor(tokens)
    return torch.nn.functional.one_hot(t, vocab).float() * 5 + torch.rand(*t.shape, vocab)


# ---- greedy ----------------------------------------------------------------------------


def test_accept_greedy_constructed_cases() -> None:
    draft = torch.tensor([[4, 5, 6], [4, 5, 6], [4, 5, 6], [1, 2, 3]])
    target_argmax = [
        [4, 5, 6, 9],  # all accepted, bonus from row gamma
        [7, 5, 6, 9],  # none: bonus is the target's token at row 0
        [4, 5, 8, 9],  # two accepted, bonus at row 2
        [1, 0, 3, 9],  # a later match after a mismatch does not count
    ]
    logits = one_hot_logits(target_argmax, 10)
    with sync_guard():
        res = accept_greedy(draft, logits)
    assert res.accept_len.dtype == torch.int32 and res.out_tokens.dtype == torch.int64
    assert res.accept_len.tolist() == [4, 1, 3, 2]
    assert res.out_tokens.tolist() == [[4, 5, 6, 9], [7, -1, -1, -1], [4, 5, 8, -1], [1, 0, -1, -1]]


def test_accept_greedy_rejects_a_wrong_window() -> None:
    with pytest.raises(ValueError, match="gamma"):
        accept_greedy(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, 5))


def test_finalize_and_commit_slots() -> None:
    accept_len = torch.tensor([4, 1, 3], dtype=torch.int32)
    seq_lens = torch.tensor([10, 0, 7], dtype=torch.int32)
    window = torch.arange(12).view(3, 4) + 100
    with sync_guard():
        new_lens = finalize(accept_len, seq_lens)
        slots = commit_slots(window, accept_len)
    assert new_lens.dtype == torch.int32 and new_lens.tolist() == [14, 1, 10]
    assert slots.tolist() == [[100, 101, 102, 103], [104, -1, -1, -1], [108, 109, 110, -1]]


# ---- sampled: agreement with the NumPy reference ------------------------------------------


def random_case(batch: int, gamma: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=gen) * 2, dim=-1)
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=gen) * 2, dim=-1)
    # Edge cases: p with zeros (a top-k filter), q = 0 at the draft, p == q exactly.
    p[::3] = torch.where(p[::3] < p[::3].topk(3, dim=-1).values[..., -1:], 0.0, p[::3])
    p = p / p.sum(-1, keepdim=True)
    q[1::5, :] = p[1::5, :gamma]
    draft = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, gamma)
    q[2::7, 0] = q[2::7, 0].scatter(-1, draft[2::7, :1], 0.0)
    return draft, q, p


def test_chain_rejection_agrees_with_numpy_reference() -> None:
    batch, gamma, vocab = 400, 4, 12
    draft, q, p = random_case(batch, gamma, vocab, seed=1)
    key, counter = torch.arange(batch) * 7 + 3, torch.full((batch,), 5)
    coin_u, resample_u = acceptance_uniforms(key, counter, gamma)
    with sync_guard():
        res = chain_rejection(draft, q, p, coin_u, resample_u)
        via_key = accept_sampled(draft, q, p, key, counter)
    ref_out, ref_len = chain_rejection_numpy(draft.numpy(), q.numpy(), p.numpy(), coin_u.numpy(), resample_u.numpy())
    assert np.array_equal(res.out_tokens.numpy(), ref_out)
    assert np.array_equal(res.accept_len.numpy(), ref_len)
    assert torch.equal(via_key.out_tokens, res.out_tokens) and torch.equal(via_key.accept_len, res.accept_len)
    assert len(set(ref_len.tolist())) == gamma + 1  # every accept length occurred


def test_sampled_edge_cases() -> None:
    p = torch.tensor([[[0.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]])  # [1, W=2, V]
    ones = torch.ones(1, 1)
    race = torch.full((1,), 0.5)
    # q(d) = 0 with p(d) > 0: min(1, p/0) = 1, accepted whatever the coin.
    res = chain_rejection(torch.tensor([[1]]), torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]), p, ones * 0.999, race)
    assert res.accept_len.tolist() == [2]
    # p(d) = 0: never accepted, even with the smallest coin; resampled where p > q.
    res = chain_rejection(torch.tensor([[2]]), torch.tensor([[[0.0, 0.0, 1.0, 0.0]]]), p, ones * 1e-7, race)
    assert res.accept_len.tolist() == [1] and res.out_tokens.tolist() == [[1, -1]]
    # Residual mass 0 (q == p up to rounding, reached only by a float tie): falls back to p.
    q_same = p[:, :1].clone()
    res = chain_rejection(torch.tensor([[0]]), q_same, p, ones, race)
    assert res.out_tokens[0, 0].item() == 1


def test_mixed_batch_picks_per_row() -> None:
    batch, gamma, vocab = 64, 3, 10
    draft, q, p = random_case(batch, gamma, vocab, seed=2)
    logits = torch.randn(batch, gamma + 1, vocab)
    logits[::2, :gamma] = torch.nn.functional.one_hot(draft[::2], vocab) * 10.0  # greedy rows accept all
    greedy_mask = torch.arange(batch) % 4 < 2
    key, counter = torch.arange(batch), torch.zeros(batch, dtype=torch.int64)
    with sync_guard():
        mixed = accept(draft, q, logits, p, key, counter, greedy_mask)
    greedy = accept_greedy(draft, logits)
    sampled = accept_sampled(draft, q, p, key, counter)
    for b in range(batch):
        want = greedy if greedy_mask[b] else sampled
        assert torch.equal(mixed.out_tokens[b], want.out_tokens[b])
        assert mixed.accept_len[b] == want.accept_len[b]


def test_draft_probs() -> None:
    logits = torch.randn(3, 2, 7)
    temp = torch.tensor([0.0, 1.0, 0.5])
    q = draft_probs(logits, temp)
    torch.testing.assert_close(q.sum(-1), torch.ones(3, 2))
    assert torch.equal(q[0].argmax(-1), logits[0].argmax(-1)) and q[0].max() == 1.0
    torch.testing.assert_close(q[2], torch.softmax(logits[2] / 0.5, -1))


# ---- sampled: exactness ---------------------------------------------------------------------


def chi_square_p(observed: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit; cells expected below 5 are pooled. Observed mass where probs is 0 fails."""
    observed, probs = observed.ravel().astype(np.float64), probs.ravel().astype(np.float64)
    assert observed[probs <= 0].sum() == 0, "a token with target probability 0 was emitted"
    expected = probs * observed.sum()
    small = (expected < 5) & (probs > 0)
    keep = expected >= 5
    obs = np.append(observed[keep], observed[small].sum())
    exp = np.append(expected[keep], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def top_k_top_p(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The filtered, renormalised law a sampler with these filters draws from."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = (torch.arange(probs.shape[-1]) < top_k) & (sorted_p.cumsum(-1) - sorted_p < top_p)
    filtered = torch.zeros_like(probs).scatter(-1, order, torch.where(keep, sorted_p, 0.0))
    return filtered / filtered.sum(-1, keepdim=True)


@pytest.mark.parametrize("filtered", [False, True])
def test_first_token_follows_target_law(filtered: bool) -> None:
    batch, gamma, vocab = 30000, 3, 16
    gen = torch.Generator().manual_seed(11 + filtered)
    p_rows = torch.softmax(torch.randn(gamma + 1, vocab, generator=gen) * 1.5, -1)
    if filtered:
        p_rows = top_k_top_p(p_rows, top_k=6, top_p=0.8)  # q keeps mass outside p's support
    q_rows = torch.softmax(torch.randn(gamma, vocab, generator=gen) * 1.5, -1)
    p = p_rows.expand(batch, -1, -1)
    q = q_rows.expand(batch, -1, -1)
    draft = torch.multinomial(q_rows, batch, replacement=True, generator=gen).T.contiguous()  # [B, gamma]
    res = accept_sampled(draft, q, p, torch.arange(batch) + 1000 * filtered, torch.full((batch,), 3))
    first = np.bincount(res.out_tokens[:, 0].numpy(), minlength=vocab)
    assert chi_square_p(first, p_rows[0].numpy()) > P_VALUE_FLOOR
    # Rows are independent positions here, so each committed column c follows p_c as well.
    for col in range(1, gamma + 1):
        emitted = res.accept_len > col
        counts = np.bincount(res.out_tokens[emitted, col].numpy(), minlength=vocab)
        assert chi_square_p(counts, p_rows[col].numpy()) > P_VALUE_FLOOR


@pytest.mark.parametrize("filtered", [False, True])
def test_decoded_chain_follows_target_law(filtered: bool) -> None:
    """A bigram target P and a different bigram drafter Q decode three tokens per row through
    repeated draft/verify steps (anchor = last bonus); the joint law of the three tokens must
    be P(a, x1) P(x1, x2) P(x2, x3), whatever Q proposes."""
    batch, gamma, vocab, length = 24000, 3, 6, 3
    gen = torch.Generator().manual_seed(21 + filtered)
    target = torch.softmax(torch.randn(vocab, vocab, generator=gen) * 1.5, -1)  # P[prev] -> next
    if filtered:
        target = top_k_top_p(target, top_k=3, top_p=0.9)
    drafter = torch.softmax(torch.randn(vocab, vocab, generator=gen) * 1.5, -1)
    produced = torch.full((batch, length * (gamma + 1)), -1, dtype=torch.int64)
    num_produced = torch.zeros(batch, dtype=torch.int64)
    anchor = torch.zeros(batch, dtype=torch.int64)
    key = torch.arange(batch) + 77
    for step in range(length):  # every step commits at least one token
        drafts, prev = [], anchor
        for _ in range(gamma):
            prev = torch.multinomial(drafter[prev], 1, generator=gen).squeeze(1)
            drafts.append(prev)
        draft = torch.stack(drafts, 1)  # [B, gamma]
        q = drafter[torch.cat([anchor[:, None], draft[:, :-1]], 1)]  # [B, gamma, V]
        p = target[torch.cat([anchor[:, None], draft], 1)]  # [B, W, V]: row j conditions on input j
        res = accept_sampled(draft, q, p, key, torch.full((batch,), step))
        cols = num_produced[:, None] + torch.arange(gamma + 1)
        committed = torch.arange(gamma + 1) < res.accept_len[:, None]
        produced.scatter_(1, cols, torch.where(committed, res.out_tokens, produced.gather(1, cols)))
        num_produced += res.accept_len.long()
        anchor = res.out_tokens.gather(1, res.accept_len.long()[:, None] - 1).squeeze(1)
    x = produced[:, :length].numpy()
    assert (x >= 0).all()
    cells = np.bincount((x[:, 0] * vocab + x[:, 1]) * vocab + x[:, 2], minlength=vocab**3)
    t = target.double().numpy()
    law = t[0][:, None, None] * t[:, :, None] * t[None, :, :]  # [x1, x2, x3]
    assert chi_square_p(cells, law) > P_VALUE_FLOOR


# ---- the drafter's Markov sampler ---------------------------------------------------------


def test_markov_block_draws_follow_the_step_law() -> None:
    """Draft tokens of sampled rows follow softmax(step / T), the q handed to acceptance."""
    batch, gamma, vocab, rank, temp = 30000, 2, 8, 4, 0.7
    gen = torch.Generator().manual_seed(5)
    head = MarkovHead(vocab, rank)
    with torch.no_grad():
        head.w2.copy_(torch.randn(rank, vocab, generator=gen))
    base = torch.randn(gamma, vocab, generator=gen).expand(batch, -1, -1)
    anchor = torch.full((batch,), 3)
    temperature = torch.full((batch,), temp)
    temperature[:10] = 0.0
    key, counter = torch.arange(batch), torch.zeros(batch, dtype=torch.int64)
    uniforms = uniform(key, counter, gamma, Stream.DRAFT)
    with torch.no_grad(), sync_guard():
        block = markov_block(base, anchor, head, temperature, uniforms)
    assert torch.equal(block.draft_tokens[:10], block.step_logits[:10].argmax(-1))
    with torch.no_grad():
        q = draft_probs(block.step_logits, temperature)
        tokens = block.draft_tokens[10:].numpy()
        law0 = q[10, 0].numpy()
        assert chi_square_p(np.bincount(tokens[:, 0], minlength=vocab), law0) > P_VALUE_FLOOR
        # Position 1 conditions on position 0 through the Markov bias.
        law1 = torch.softmax((base[0, 1] + head.bias(head.w1)) / temp, -1).numpy()  # [prev, V]
        joint = law0[:, None] * law1
        assert chi_square_p(np.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab**2), joint) > P_VALUE_FLOOR
        torch.testing.assert_close(block.step_logits[:, 1], base[:, 1] + head.bias(head.w1[block.draft_tokens[:, 0]]))


def test_sample_categorical_never_draws_zero_weight() -> None:
    weights = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0], [1e-30, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0]])
    for u in (2.0**-24, 0.3, 0.5, 1.0 - 2.0**-24):
        drawn = sample_categorical(weights, torch.full((3,), u))
        assert drawn[0].item() in (1, 3) and drawn[1].item() == 0 and drawn[2].item() == 4
    # The split of the unit interval follows the weights: u below 0.3 -> token 1, above -> 3.
    assert sample_categorical(weights[:1], torch.tensor([0.2999])).item() == 1
    assert sample_categorical(weights[:1], torch.tensor([0.3001])).item() == 3
