"""logit_bias through the whole engine, on the random Llamas of tests/engine: the bias holds
on prefill's first token and every decode step, plain and DSpark, greedy and sampled;
DSpark greedy with a bias equals plain greedy with the same bias; sampled DSpark follows the
biased target's law (its drafter proposes unbiased tokens, and acceptance holds them to the
biased target); an unbiased request's tokens do not change when a biased one joins its
batch; the step loop with biased requests passes the CPU sync guard."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from engine.config import SpeculativeConfig
from engine.core import EngineCore
from engine.loader.load import LoadedModel
from engine.sampling_params import SamplingParams
from engine.sync_guard import SyncGuard
from tests.engine.conftest import SHORT_PROMPTS, EngineFactory, random_drafter_dir
from tests.engine.engine_driver import run
from tests.engine.test_spec_lossless import _second_token_law

FORCED = 1234  # a token of the tiny model's 49152


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory: pytest.TempPathFactory, tiny: LoadedModel) -> SpeculativeConfig:
    return SpeculativeConfig(drafter=str(random_drafter_dir(tmp_path_factory.mktemp("drafter"), tiny, gamma=4)))


@pytest.fixture(scope="module")
def small_spec(tmp_path_factory: pytest.TempPathFactory, small_vocab: LoadedModel) -> SpeculativeConfig:
    drafter = random_drafter_dir(
        tmp_path_factory.mktemp("small-drafter"),
        small_vocab,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=64,
        markov_rank=8,
    )
    return SpeculativeConfig(drafter=str(drafter))


def _tokens(engine: EngineCore, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list:
    return [r.token_ids for r in run(engine, prompts, params)]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_a_forced_token_holds_from_the_first_token_on(
    make_tiny_engine: EngineFactory, tiny_spec: SpeculativeConfig, speculative: bool, temperature: float
) -> None:
    engine = make_tiny_engine(speculative=tiny_spec if speculative else None)
    params = SamplingParams(
        max_tokens=10, temperature=temperature, seed=3, ignore_eos=True, logit_bias={FORCED: 100.0, 7: -100.0}
    )
    assert _tokens(engine, SHORT_PROMPTS, params) == [[FORCED] * 10] * len(SHORT_PROMPTS)


def test_an_unbiased_request_is_unchanged_by_a_biased_neighbour(make_tiny_engine: EngineFactory) -> None:
    mine = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True),
    ]
    neighbour = SamplingParams(max_tokens=12, temperature=0.8, seed=9, ignore_eos=True)
    biased = dataclasses.replace(neighbour, logit_bias={t: 4.0 for t in range(1000, 1200)})
    alone = _tokens(make_tiny_engine(), SHORT_PROMPTS, [*mine, neighbour])
    mixed = _tokens(make_tiny_engine(), SHORT_PROMPTS, [*mine, biased])
    assert mixed[:2] == alone[:2]
    assert mixed[2] != alone[2]


def test_dspark_greedy_with_a_bias_equals_plain_greedy_with_it(
    make_tiny_engine: EngineFactory, tiny_spec: SpeculativeConfig
) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    chosen = {t for tokens in _tokens(make_tiny_engine(), SHORT_PROMPTS, greedy) for t in tokens}
    # Ban every token the unbiased run chose and lift others: the output has to change.
    bias = {**dict.fromkeys(range(1000, 1100), 3.0), **dict.fromkeys(chosen, -100.0)}
    params = dataclasses.replace(greedy, logit_bias=bias)
    plain = _tokens(make_tiny_engine(), SHORT_PROMPTS, params)
    dspark = make_tiny_engine(speculative=tiny_spec)
    assert _tokens(dspark, SHORT_PROMPTS, params) == plain
    assert not chosen & {t for tokens in plain for t in tokens}
    assert dspark.stats().spec_verify_steps_total > 0


def test_dspark_accepts_drafts_only_where_every_verify_row_is_biased(
    make_small_vocab_engine: EngineFactory, small_spec: SpeculativeConfig
) -> None:
    """Each of the 32 tokens forced in turn (+100). Plain decoding gives that token only;
    so must DSpark, whose random drafter proposes it at some positions of some blocks: such
    drafts are accepted only if verify rows past the first carry the bias too, and a bonus
    drawn from an unbiased row would break the run of forced tokens."""
    prompts = [[1, 5, 9, 4, 12], [1, 7, 7, 3], [1, 30, 2, 8, 8, 6, 11]]
    dspark = make_small_vocab_engine(speculative=small_spec, enable_prefix_cache=False)
    for token in range(32):
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias={token: 100.0})
        assert _tokens(dspark, prompts, params) == [[token] * 12] * len(prompts), token
    accepted = dspark.stats().spec_accepted_per_position
    assert sum(accepted[1:]) > 0, "no draft past the first was accepted: the test proves nothing"


def test_sampled_dspark_follows_the_biased_target_law(
    make_small_vocab_engine: EngineFactory, small_spec: SpeculativeConfig, small_vocab: LoadedModel
) -> None:
    """The second token (the first one DSpark verifies) over 6000 seeded requests: its law is
    that of the biased target, and visibly not the unbiased one's."""
    bias = {**dict.fromkeys(range(3, 11), -100.0), 20: 2.5, 21: 1.5, 25: -1.0}
    params = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True, logit_bias=bias)
    prompt, num_samples = [1, 5, 9, 4, 12], 6000
    engine = make_small_vocab_engine(max_num_seqs=256, speculative=small_spec, enable_prefix_cache=False)
    seeded = [dataclasses.replace(params, seed=s) for s in range(num_samples)]
    second = np.array([tokens[1] for tokens in _tokens(engine, [prompt] * num_samples, seeded)])
    law = _second_token_law(small_vocab, prompt, params)
    unbiased_law = _second_token_law(small_vocab, prompt, dataclasses.replace(params, logit_bias=None))
    observed = np.bincount(second, minlength=len(law)).astype(np.float64)
    assert observed[3:11].sum() == 0 and law[3:11].max() < 1e-30
    frequent = law * num_samples >= 5  # pool rare cells: every cell expects >= 5
    obs = np.append(observed[frequent], observed[~frequent].sum())
    exp = np.append(law[frequent], law[~frequent].sum()) * num_samples
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    assert np.abs(law - unbiased_law).sum() > 0.2  # the bias matters to this law
    assert engine.stats().spec_verify_steps_total >= num_samples


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_step_loop_with_biased_requests_passes_the_cpu_sync_guard(
    make_tiny_engine: EngineFactory, tiny_spec: SpeculativeConfig, speculative: bool
) -> None:
    engine = make_tiny_engine(max_num_batched_tokens=16, speculative=tiny_spec if speculative else None)
    mixed = [
        SamplingParams(max_tokens=8, temperature=0.0, logit_bias={FORCED: 100.0}),
        SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=3, logit_bias=dict.fromkeys(range(40), 2.0)),
        SamplingParams(max_tokens=8, temperature=0.7, top_k=20, frequency_penalty=0.5, logprobs=2),
        SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=1.3, logit_bias={5: -100.0, 6: 1.0}),
    ]
    for i, params in enumerate(mixed):
        engine.add_request(f"g{i}", SHORT_PROMPTS[i % len(SHORT_PROMPTS)], params)
    steps = 0
    with SyncGuard("cpu") as guard:
        engine.attach_sync_guard(guard)
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    assert 0 < guard.waits <= steps
    assert engine.kv.usage().used_slots == 0
