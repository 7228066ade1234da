"""OpenAI `logit_bias` in SamplingParams and the sampler: bad values are refused naming the
field; +100 forces a token and -100 bans one, greedy or sampled, through every filter and
the sparse top-k path; the sampled law is the softmax of the biased logits (against a
reference, and in empirical frequencies); the bias comes before the penalties; rows without
a bias come out bit for bit as in a batch without any; logprobs stay the raw model's."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest
import torch
from sampling_reference import reference_logit_bias, reference_penalties, reference_probs
from scipy import stats

from engine.sampling import rng
from engine.sampling.logit_bias import batch_bias_width, bias_width
from engine.sampling.penalties import PenaltyState
from engine.sampling.sampler import Sampler, SamplingTensors, processed_logits, processed_probs
from engine.sampling_params import LogitBias, SamplingParams

VOCAB = 64
P_MIN = 1e-3


def _tensors(params: list[SamplingParams], vocab: int = VOCAB, seeds: list[int] | None = None) -> SamplingTensors:
    keys = [rng.request_key(p.seed, 0, i) if seeds is None else seeds[i] for i, p in enumerate(params)]
    return SamplingTensors.from_params(params, keys, "cpu", vocab_size=vocab)


def _logits(batch: int, vocab: int = VOCAB, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _biased(params: SamplingParams, bias: dict[int, float]) -> SamplingParams:
    return dataclasses.replace(params, logit_bias=bias)


# -- SamplingParams ------------------------------------------------------------------------


def test_logit_bias_is_stored_as_an_immutable_mapping() -> None:
    source: dict[int, float] = {7: 2.5, 3: -100, 11: 100}
    params = SamplingParams(logit_bias=source)
    source[5] = 1.0  # the caller's dict is copied
    assert isinstance(params.logit_bias, LogitBias)
    assert dict(params.logit_bias) == {3: -100.0, 7: 2.5, 11: 100.0}
    assert list(params.logit_bias) == [3, 7, 11]  # ids ascending
    assert all(isinstance(b, float) for b in params.logit_bias.values())
    same = SamplingParams(logit_bias={11: 100.0, 7: 2.5, 3: -100.0})
    assert params == same and hash(params) == hash(same)
    assert pickle.loads(pickle.dumps(params)) == params  # crosses process boundaries
    with pytest.raises(TypeError):
        params.logit_bias[3] = 0.0  # type: ignore[index]
    assert SamplingParams(logit_bias={}).logit_bias is None
    assert SamplingParams(logit_bias=dict.fromkeys(range(300), -1.0)).logit_bias is not None


BAD_LOGIT_BIAS: dict[str, object] = {
    "not_a_mapping": [(1, 2.0)],
    "negative_id": {-1: 1.0},
    "bool_id": {True: 1.0},
    "string_id": {"50256": 1.0},  # OpenAI's JSON keys are strings: the gateway converts them
    "float_id": {1.0: 1.0},
    "above_100": {1: 100.5},
    "below_minus_100": {1: -101},
    "nan": {1: math.nan},
    "inf": {1: -math.inf},
    "string_value": {1: "3"},
    "bool_value": {1: True},
    "301_entries": dict.fromkeys(range(301), 1.0),
}


@pytest.mark.parametrize("name", sorted(BAD_LOGIT_BIAS))
def test_bad_logit_bias_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(ValueError, match=r"^logit_bias: "):
        SamplingParams(logit_bias=BAD_LOGIT_BIAS[name])  # type: ignore[arg-type]


def test_the_vocabulary_bound_is_checked_where_the_vocabulary_is_known() -> None:
    SamplingParams(logit_bias={0: 1.0, 63: -1.0}).check_vocab(64)
    SamplingParams().check_vocab(1)
    with pytest.raises(ValueError, match=r"^logit_bias: token id 64 is out of range \[0, 64\)"):
        SamplingParams(logit_bias={3: 1.0, 64: 1.0}).check_vocab(64)


def test_widths_are_few_host_known_buckets() -> None:
    widths = [bias_width(n) for n in (0, 1, 8, 9, 16, 17, 100, 256, 257, 300)]
    assert widths == [0, 8, 8, 16, 16, 32, 128, 256, 300, 300]
    many = SamplingParams(logit_bias=dict.fromkeys(range(20), 1.0))
    assert batch_bias_width([SamplingParams(), many]) == 32
    assert batch_bias_width([SamplingParams()]) == 0
    assert _tensors([SamplingParams()] * 2).logit_bias is None  # no row biased: no table, no op
    st = _tensors([SamplingParams(), SamplingParams(logit_bias={5: 1.0, 2: -3.0})])
    assert st.logit_bias is not None
    assert st.logit_bias.token_ids.tolist() == [[-1] * 8, [2, 5] + [-1] * 6]
    assert st.logit_bias.values.tolist() == [[0.0] * 8, [-3.0, 1.0] + [0.0] * 6]


# -- forcing and banning ---------------------------------------------------------------------

CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=1.0),
    "hot": SamplingParams(temperature=2.0),
    "top_k": SamplingParams(temperature=1.0, top_k=5),
    "top_p": SamplingParams(temperature=1.0, top_p=0.5),
    "min_p": SamplingParams(temperature=1.0, min_p=0.2),
    "all_filters": SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05),
}
PATHS = [(name, False) for name in sorted(CASES)] + [("top_k", True)]  # True: sparse top-k


def _draws(params: SamplingParams, logits_row: torch.Tensor, draws: int, sparse: bool) -> torch.Tensor:
    """[draws] tokens of one seeded request at positions 0 .. draws-1 over `logits_row` [V]."""
    vocab = logits_row.shape[0]
    st = _tensors([params], vocab, seeds=[77]).gather(torch.zeros(draws, dtype=torch.int64))
    return Sampler(sparse_top_k=sparse).sample(logits_row[None].expand(draws, vocab), st, torch.arange(draws)).tokens


@pytest.mark.parametrize(("name", "sparse"), PATHS)
def test_a_large_positive_bias_forces_the_token(name: str, sparse: bool) -> None:
    logits = _logits(1, seed=1)[0]
    worst = int(logits.argmin())
    tokens = _draws(_biased(CASES[name], {worst: 100.0}), logits, 2000, sparse)
    assert (tokens == worst).all()


@pytest.mark.parametrize(("name", "sparse"), PATHS)
def test_minus_100_bans_the_token(name: str, sparse: bool) -> None:
    logits = _logits(1, seed=2, scale=1.0)[0]  # near-flat: the best token is drawn often
    best = int(logits.argmax())
    draws = 4000
    unbiased = _draws(CASES[name], logits, draws, sparse)
    banned = _draws(_biased(CASES[name], {best: -100.0}), logits, draws, sparse)
    assert (unbiased == best).any()
    assert not (banned == best).any()
    if CASES[name].greedy:
        assert (banned == int(logits.topk(2).indices[1])).all()


def test_greedy_takes_the_argmax_of_the_biased_logits() -> None:
    logits = _logits(8, seed=3, scale=1.0)
    gen = torch.Generator().manual_seed(4)
    biases = [
        dict(
            zip(
                torch.randperm(VOCAB, generator=gen)[:6].tolist(),
                (torch.randn(6, generator=gen) * 2).tolist(),
                strict=True,
            )
        )
        for _ in range(8)
    ]
    params = [SamplingParams(temperature=0.0, logit_bias=bias) for bias in biases]
    dense = torch.zeros(8, VOCAB)
    for b, bias in enumerate(biases):
        dense[b, list(bias)] = torch.tensor(list(bias.values()))
    st = _tensors(params)
    assert torch.equal(processed_logits(logits, st), logits + dense)
    tokens = Sampler().sample(logits, st, torch.zeros(8, dtype=torch.int64)).tokens
    assert torch.equal(tokens, (logits + dense).argmax(-1))
    assert not torch.equal(tokens, logits.argmax(-1))  # the biases do change choices here


# -- the sampled law ---------------------------------------------------------------------------

BIAS = {0: 2.0, 3: -1.5, 7: 4.0, 12: -100.0, 30: 0.5, 63: 1.0}


@pytest.mark.parametrize("name", sorted(CASES))
def test_processed_probs_are_the_law_of_the_biased_logits(name: str) -> None:
    params = _biased(CASES[name], BIAS)
    logits = _logits(4, seed=5, scale=2.0)
    probs = processed_probs(logits, _tensors([params] * 4)).double().numpy()
    for b in range(4):
        expected = reference_probs(reference_logit_bias(logits[b].numpy(), params), params)
        np.testing.assert_allclose(probs[b], expected, atol=1e-6)


@pytest.mark.parametrize(
    ("params", "sparse"),
    [
        (SamplingParams(temperature=0.9, top_p=0.95, logit_bias={1: 3.0, 4: -2.0, 9: 1.5, 0: -100.0}), False),
        (SamplingParams(temperature=1.1, top_k=10, logit_bias={2: 2.5, 5: -1.0, 17: 2.0}), True),
    ],
    ids=["dense", "sparse_top_k"],
)
def test_empirical_frequencies_follow_the_biased_law(params: SamplingParams, sparse: bool) -> None:
    vocab, draws = 40, 12_000
    logits = _logits(1, vocab, seed=6, scale=1.5)
    tokens = _draws(params, logits[0], draws, sparse)
    expected = reference_probs(reference_logit_bias(logits[0].numpy(), params), params)
    observed = np.bincount(tokens.numpy(), minlength=vocab)
    assert observed[expected == 0].sum() == 0, "drew a token the law excludes"
    support = expected > 0
    frequent = support & (expected * draws >= 5)  # pool rare tokens: every cell expects >= 5
    obs = [*observed[frequent], observed[support & ~frequent].sum()]
    exp = [*expected[frequent] * draws, expected[support & ~frequent].sum() * draws]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, np.array(exp) * sum(obs) / sum(exp)).pvalue > P_MIN


def test_the_bias_comes_before_the_penalties() -> None:
    """vLLM's order: a repetition penalty divides the biased logit, not the raw one."""
    params = [
        SamplingParams(repetition_penalty=2.0, logit_bias={3: 4.0, 8: -1.0}),
        SamplingParams(frequency_penalty=1.0, presence_penalty=0.5, logit_bias={5: -2.0}),
    ]
    prompts, outputs = [[3, 8, 9], [1]], [[3], [5, 5]]
    state = PenaltyState(max_rows=2, vocab=VOCAB, device="cpu")
    for row in range(2):
        state.reset(row, prompts[row], outputs[row])
    logits = _logits(2, seed=7)
    logits[0, 3] = 1.0  # (1 + 4) / 2, not 1 / 2 + 4
    rows = torch.arange(2)
    got = processed_logits(logits, _tensors(params), state, rows)
    for b, p in enumerate(params):
        expected = reference_penalties(reference_logit_bias(logits[b].numpy(), p), p, prompts[b], outputs[b])
        np.testing.assert_allclose(got[b].numpy(), expected, rtol=1e-6, atol=1e-5)
    assert got[0, 3] == 2.5


# -- batches mixing biased and unbiased rows ------------------------------------------------


def test_rows_without_a_bias_are_untouched_bit_for_bit() -> None:
    vocab = 256
    base = [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.8, top_p=0.9, seed=1),
        SamplingParams(temperature=1.2, top_k=20, seed=2, logprobs=3),
        SamplingParams(temperature=1.0, min_p=0.05, seed=3),
        SamplingParams(temperature=0.7, seed=4),
    ]
    mixed = list(base)
    mixed[1] = _biased(base[1], {int(t): 5.0 for t in range(0, vocab, 9)})
    mixed[3] = _biased(base[3], {7: -100.0, 8: 100.0})
    keys = [rng.request_key(p.seed, 0, i) for i, p in enumerate(base)]
    plain_st = SamplingTensors.from_params(base, keys, "cpu", vocab_size=vocab)
    mixed_st = SamplingTensors.from_params(mixed, keys, "cpu", vocab_size=vocab)
    assert plain_st.logit_bias is None and mixed_st.logit_bias is not None
    logits = _logits(5, vocab, seed=8)
    unbiased = torch.tensor([0, 2, 4])
    sampler = Sampler()
    changed = 0
    for position in range(40):
        counters = torch.full((5,), position, dtype=torch.int64)
        plain = sampler.sample(logits, plain_st, counters)
        with_bias = sampler.sample(logits, mixed_st, counters)
        assert torch.equal(plain.tokens[unbiased], with_bias.tokens[unbiased])
        assert plain.logprobs is not None and with_bias.logprobs is not None
        for name in ("chosen", "top_ids", "top_logprobs"):
            assert torch.equal(getattr(plain.logprobs, name)[unbiased], getattr(with_bias.logprobs, name)[unbiased])
        changed += int((plain.tokens[[1, 3]] != with_bias.tokens[[1, 3]]).sum())
    assert torch.equal(processed_probs(logits, plain_st)[unbiased], processed_probs(logits, mixed_st)[unbiased])
    assert changed > 0


def test_logprobs_are_those_of_the_raw_logits() -> None:
    logits = _logits(2, seed=9)
    worst = int(logits[0].argmin())
    params = [
        SamplingParams(temperature=0.0, logprobs=3, logit_bias={worst: 100.0}),
        SamplingParams(temperature=1.0, logprobs=3, logit_bias={int(logits[1].argmax()): -100.0}),
    ]
    result = Sampler().sample(logits, _tensors(params), torch.zeros(2, dtype=torch.int64))
    assert int(result.tokens[0]) == worst
    raw = torch.log_softmax(logits, -1)
    assert result.logprobs is not None
    torch.testing.assert_close(result.logprobs.chosen, raw.gather(1, result.tokens[:, None])[:, 0])
    assert torch.equal(result.logprobs.top_ids, raw.topk(3).indices)
