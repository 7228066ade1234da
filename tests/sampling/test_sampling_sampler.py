"""engine.sampling.sampler: greedy is argmax; seeded draws are reproducible and independent
of the batch; empirical frequencies match `processed_probs`, which matches a reference; the
sparse top-k path draws what the dense path draws; the per-slot table gathers on device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampling_reference import reference_probs
from scipy import stats

from engine.sampling import rng
from engine.sampling.rng import Stream
from engine.sampling.sampler import Sampler, SamplingTensors, processed_probs, sample_from_probs
from engine.sampling.tensors import SamplingFlags
from engine.sampling_params import SamplingParams

P_MIN = 1e-3


def _tensors(params: list[SamplingParams], vocab: int, seeds: list[int] | None = None) -> SamplingTensors:
    keys = [rng.request_key(p.seed, 0, i) if seeds is None else seeds[i] for i, p in enumerate(params)]
    return SamplingTensors.from_params(params, keys, "cpu", vocab_size=vocab)


def _logits(batch: int, vocab: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_rows_take_the_argmax() -> None:
    logits = _logits(6, 300)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1e-7),  # below GREEDY_TEMPERATURE
        SamplingParams(temperature=0.9, top_k=1),
        SamplingParams(temperature=0.0, top_p=0.5, min_p=0.2),  # filters are moot when greedy
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=3),
    ]
    st = _tensors(params, 300)
    assert st.flags.all_greedy
    result = Sampler().sample(logits, st, torch.arange(6))
    assert torch.equal(result.tokens, logits.argmax(-1))
    probs = processed_probs(logits, st)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 300).float())


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    logits = _logits(8, 200, seed=1)
    params = [SamplingParams(temperature=0.0 if b % 2 else 1.5, seed=b) for b in range(8)]
    st = _tensors(params, 200)
    tokens = Sampler().sample(logits, st, torch.full((8,), 4)).tokens
    assert torch.equal(tokens[1::2], logits.argmax(-1)[1::2])


def test_same_seed_same_position_same_token_whatever_the_batch() -> None:
    vocab = 500
    logits = _logits(1, vocab, seed=2, scale=1.0)
    mine = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    counters = torch.arange(16, dtype=torch.int64) + 100

    def tokens_of_mine(others: list[SamplingParams], position: int) -> torch.Tensor:
        params = [*others[:position], mine, *others[position:]]
        batch_logits = torch.cat([_logits(len(others), vocab, seed=3), logits])  # mine last ...
        batch_logits = batch_logits[[*range(position), len(others), *range(position, len(others))]]  # ... moved
        st = _tensors(params, vocab)
        out = []
        for counter in counters:
            c = torch.full((len(params),), int(counter))
            out.append(Sampler().sample(batch_logits, st, c).tokens[position])
        return torch.stack(out)

    alone = tokens_of_mine([], 0)
    crowd = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, seed=9),
        SamplingParams(temperature=1.3, min_p=0.1),
        SamplingParams(repetition_penalty=1.2),
    ]
    assert torch.equal(tokens_of_mine(crowd, 2), alone)
    assert torch.equal(tokens_of_mine(crowd[:1], 1), alone)
    assert len(set(alone.tolist())) > 5  # it does sample
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, seed=1235)
    st = _tensors([other_seed], vocab)
    assert not torch.equal(torch.stack([Sampler().sample(logits, st, c[None]).tokens[0] for c in counters]), alone)


CASES = {
    "temperature": SamplingParams(temperature=0.7),
    "hot": SamplingParams(temperature=1.8),
    "top_k": SamplingParams(temperature=1.0, top_k=5),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8),
    "min_p": SamplingParams(temperature=1.0, min_p=0.1),
    "top_k_top_p": SamplingParams(temperature=0.9, top_k=12, top_p=0.7),
    "all_filters": SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05),
    "top_p_min_p": SamplingParams(temperature=0.8, top_p=0.95, min_p=0.02),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_processed_probs_match_reference(name: str) -> None:
    params = CASES[name]
    logits = _logits(4, 64, seed=5, scale=2.0)
    st = _tensors([params] * 4, 64)
    probs = processed_probs(logits, st).double().numpy()
    for b in range(4):
        np.testing.assert_allclose(probs[b], reference_probs(logits[b].numpy(), params), atol=1e-6)


FREQUENCY_CASES = [(name, False) for name in sorted(CASES)] + [
    (name, True)
    for name in sorted(CASES)
    if CASES[name].top_k > 0  # the sparse top-k path too
]


@pytest.mark.parametrize(("name", "sparse"), FREQUENCY_CASES)
def test_empirical_frequencies_match_processed_probs(name: str, sparse: bool) -> None:
    vocab, draws = 40, 12_000
    params = CASES[name]
    logits = _logits(1, vocab, seed=6, scale=1.5).expand(draws, vocab)
    st = _tensors([params], vocab, seeds=[77]).gather(torch.zeros(draws, dtype=torch.int64))
    counters = torch.arange(draws, dtype=torch.int64)  # one request, 12k positions
    tokens = Sampler(sparse_top_k=sparse).sample(logits, st, counters).tokens
    expected = processed_probs(logits[:1], st.gather(torch.tensor([0]))).double().numpy()[0]
    observed = np.bincount(tokens.numpy(), minlength=vocab)
    assert observed[expected == 0].sum() == 0, "drew a filtered-out token"
    support = expected > 0
    # Pool the rare tokens so that every chi-square cell expects >= 5 draws.
    frequent = support & (expected * draws >= 5)
    obs = [*observed[frequent], observed[support & ~frequent].sum()]
    exp = [*expected[frequent] * draws, expected[support & ~frequent].sum() * draws]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    if len(obs) > 1:
        assert stats.chisquare(obs, np.array(exp) * sum(obs) / sum(exp)).pvalue > P_MIN
    else:
        assert observed[frequent].sum() == draws


def test_sparse_top_k_path_draws_what_the_dense_path_draws() -> None:
    vocab, batch = 2048, 64
    logits = _logits(batch, vocab, seed=7, scale=2.0)
    params = [
        SamplingParams(temperature=1.1, top_k=[3, 40, 200, 7][b % 4], top_p=[1.0, 0.9][b % 2], seed=b)
        for b in range(batch)
    ]
    st = _tensors(params, vocab)
    assert st.flags.all_top_k
    counters = torch.arange(batch, dtype=torch.int64) * 3
    sparse = Sampler(sparse_top_k=True).sample(logits, st, counters).tokens
    dense = Sampler(sparse_top_k=False).sample(logits, st, counters).tokens
    assert torch.equal(sparse, dense)


def test_sample_from_probs_takes_unnormalised_weights() -> None:
    weights = torch.tensor([[0.0, 3.0, 1.0, 0.0]]).expand(20_000, 4)  # a residual max(p - q, 0)
    key = torch.full((20_000,), 5, dtype=torch.int64)
    tokens = sample_from_probs(weights, key, torch.arange(20_000), Stream.RESIDUAL)
    counts = np.bincount(tokens.numpy(), minlength=4)
    assert counts[0] == counts[3] == 0
    assert stats.binomtest(int(counts[1]), 20_000, 0.75).pvalue > P_MIN


def test_streams_give_different_draws() -> None:
    logits = torch.zeros(1, 1000).expand(64, 1000)
    st = _tensors([SamplingParams(seed=3)] * 64, 1000)
    counters = torch.arange(64)
    target = Sampler().sample(logits, st, counters, stream=Stream.TARGET).tokens
    draft = Sampler().sample(logits, st, counters, stream=Stream.DRAFT).tokens
    assert (target != draft).sum() > 50


def test_logprobs_in_result_come_from_raw_logits() -> None:
    logits = _logits(3, 100, seed=8)
    params = [SamplingParams(temperature=0.5, logprobs=2), SamplingParams(logprobs=5), SamplingParams()]
    result = Sampler().sample(logits, _tensors(params, 100), torch.zeros(3, dtype=torch.int64))
    assert result.logprobs is not None
    raw = torch.log_softmax(logits, -1)
    assert result.logprobs.top_ids.shape == (3, 5)
    torch.testing.assert_close(result.logprobs.chosen, raw.gather(1, result.tokens[:, None])[:, 0])
    assert Sampler().sample(logits, _tensors([SamplingParams()] * 3, 100), torch.zeros(3)).logprobs is None


def test_table_gather_matches_direct_build() -> None:
    vocab = 1000
    params = [
        SamplingParams(temperature=0.6, top_k=30, seed=1),
        SamplingParams(temperature=0.0),
        SamplingParams(top_p=0.5, min_p=0.1, frequency_penalty=0.5, seed=2),
    ]
    keys = [rng.request_key(p.seed, 0, i) for i, p in enumerate(params)]
    table = SamplingTensors.empty(8, "cpu", vocab_size=vocab)
    slots = torch.tensor([6, 2, 4])
    table.write_rows(slots, SamplingTensors.from_params(params, keys, "cpu", vocab_size=vocab))
    order = torch.tensor([2, 0, 1])  # batch rows in another order than admission
    gathered = table.gather(slots[order], SamplingFlags.from_params([params[i] for i in order], vocab))
    direct = SamplingTensors.from_params([params[i] for i in order], [keys[i] for i in order], "cpu", vocab_size=vocab)
    for name in ("temperature", "top_k", "top_p", "min_p", "frequency_penalty", "key", "greedy"):
        assert torch.equal(getattr(gathered, name), getattr(direct, name)), name
    logits = _logits(3, vocab, seed=9)
    counters = torch.tensor([10, 11, 12])
    assert torch.equal(
        Sampler().sample(logits, gathered, counters).tokens, Sampler().sample(logits, direct, counters).tokens
    )
    conservative = table.gather(slots[order])  # the table's own flags: every path on, same law
    torch.testing.assert_close(processed_probs(logits, conservative), processed_probs(logits, direct))


def test_top_k_is_clamped_to_the_vocabulary() -> None:
    st = _tensors([SamplingParams(top_k=10_000), SamplingParams(top_k=-1), SamplingParams(top_k=50)], 100)
    assert st.top_k.tolist() == [0, 0, 50]
    assert st.flags.max_top_k == 50 and not st.flags.all_top_k
