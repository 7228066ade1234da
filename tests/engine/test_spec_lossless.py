"""DSpark must be lossless: greedy speculative output equals plain greedy output token for
token (batch 1 and 8, prefix cache and chunked prefill on, stop strings inside a block), and
sampled output follows the target's own distribution exactly.

The drafter here is untrained (random weights): acceptance is low, which exercises the
rejection path on every step; the shipped drafter's acceptance is measured in benchmarks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats

from engine.config import SpeculativeConfig
from engine.sampling_params import SamplingParams
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.conftest import random_drafter_dir
from tests.engine.engine_driver import chat_ids, run
from tests.models.model_harness import last_logits


@pytest.fixture(scope="module")
def spec(tmp_path_factory, smollm) -> SpeculativeConfig:
    return SpeculativeConfig(drafter=str(random_drafter_dir(tmp_path_factory.mktemp("drafter"), smollm)))


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_spec_equals_plain(make_engine, spec, batch):
    plain = make_engine(max_num_seqs=batch, max_num_batched_tokens=64)
    dspark = make_engine(max_num_seqs=batch, max_num_batched_tokens=64, speculative=spec)
    prompts = [chat_ids(plain, c) for c in CHAT_PROMPTS[:4] + CHAT_PROMPTS[17:19]]
    expected = run(plain, prompts, _greedy(24))
    got = run(dspark, prompts, _greedy(24))
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert [g.text for g in got] == [e.text for e in expected]
    assert dspark.stats().spec_verify_steps_total > 0
    assert dspark.kv.usage().used_slots == 0


def test_batches_over_the_cap_decode_without_drafting_and_stay_lossless(make_engine, spec):
    """5 requests of staggered lengths under max_batch_size=2: the first steps (5, 4, 3
    requests) decode one token each without drafting, the last ones draft again. Greedy
    output is the plain engine's either way, and fewer steps verified than without the cap."""
    prompts = [chat_ids(make_engine(), c) for c in CHAT_PROMPTS[5:10]]
    params = [_greedy(n) for n in (6, 10, 14, 18, 22)]
    expected = run(make_engine(max_num_seqs=5), prompts, params)
    always = make_engine(max_num_seqs=5, speculative=spec)
    capped = make_engine(max_num_seqs=5, speculative=dataclasses.replace(spec, max_batch_size=2))
    got_always = run(always, prompts, params)
    got_capped = run(capped, prompts, params)
    assert [g.token_ids for g in got_capped] == [e.token_ids for e in expected]
    assert [g.token_ids for g in got_always] == [e.token_ids for e in expected]
    stats, always_stats = capped.stats(), always.stats()
    assert 0 < stats.spec_verify_steps_total < always_stats.spec_verify_steps_total
    # every request's every decode step either verified or decoded one undrafted token
    assert stats.spec_undrafted_tokens_total > 0 and always_stats.spec_undrafted_tokens_total == 0
    assert capped.kv.usage().used_slots == 0


def test_sampled_steps_without_drafting_are_plain_decoding(make_engine, spec):
    """Two seeded sampled requests finishing together under max_batch_size=1: no step
    drafts, and each step samples as plain decoding does (same counter-based draw), so the
    tokens are the plain engine's, token for token."""
    prompts = [chat_ids(make_engine(), c) for c in CHAT_PROMPTS[2:4]]
    params = [
        SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=11 + i, ignore_eos=True) for i in range(2)
    ]
    expected = run(make_engine(max_num_seqs=2), prompts, params)
    capped = make_engine(max_num_seqs=2, speculative=dataclasses.replace(spec, max_batch_size=1))
    got = run(capped, prompts, params)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert capped.stats().spec_verify_steps_total == 0
    # one undrafted token per request and decode step: all but the first token (prefill's)
    assert capped.stats().spec_undrafted_tokens_total == sum(len(g.token_ids) - 1 for g in got)


def test_steps_without_drafting_keep_the_draft_kv(make_engine, spec):
    """Under the cap every committed token still gets its draft KV: after steps of two
    requests with max_batch_size=1 (none drafted), a request's draft KV equals what a
    prefill of the same tokens injects, position for position."""
    capped = make_engine(max_num_seqs=2, speculative=dataclasses.replace(spec, max_batch_size=1))
    for i, conversation in enumerate(CHAT_PROMPTS[:2]):
        capped.add_request(f"cap-{i}", chat_ids(capped, conversation), SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(10):
        capped.step()
    req = capped.requests["cap-0"]
    assert req.kv_len >= len(req.prompt_ids) + 5, "several tokens decoded without drafting"
    assert capped.stats().spec_verify_steps_total == 0
    _, draft = capped.runner.export_kv(req)
    tokens = list(req.all_ids[: req.kv_len])

    reference = make_engine(speculative=spec)
    reference.add_request("ref", tokens, _greedy(8))
    while reference.requests["ref"].kv_len < len(tokens):
        reference.step()
    _, expected = reference.runner.export_kv(reference.requests["ref"])
    assert draft is not None and expected is not None
    torch.testing.assert_close(draft, expected[:, :, : len(tokens)], atol=1e-4, rtol=1e-4)
    for engine in (capped, reference):
        while engine.has_unfinished_requests():
            engine.step()


def test_stop_string_inside_a_block(make_engine, spec):
    plain = make_engine()
    dspark = make_engine(speculative=spec)
    prompt = chat_ids(plain, CHAT_PROMPTS[2])
    reference = run(plain, [prompt], _greedy(48))[0].text
    stop = reference[len(reference) // 2 : len(reference) // 2 + 4]
    params = SamplingParams(max_tokens=48, temperature=0.0, stop=(stop,))
    expected = run(plain, [prompt], params)[0]
    got = run(dspark, [prompt], params)[0]
    assert (got.text, got.finish_reason, got.token_ids) == (expected.text, "stop", expected.token_ids)
    assert stop not in got.text


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_spec_equals_plain_30_prompts(make_engine, spec, batch):
    from tests.data.spec_prompts import spec_prompt_conversations

    plain = make_engine(max_num_seqs=batch)
    dspark = make_engine(max_num_seqs=batch, speculative=spec)
    prompts = [chat_ids(plain, c) for c in spec_prompt_conversations(30)]
    assert [g.token_ids for g in run(dspark, prompts, _greedy(128))] == [
        e.token_ids for e in run(plain, prompts, _greedy(128))
    ]


def _second_token_law(loaded, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """Exact law of the second generated token: sum_t1 p(t1) p(t2 | t1), from the model."""
    from engine.sampling.sampler import SamplingTensors, processed_probs
    from tests.models.model_harness import greedy_generate  # noqa: F401  (harness import check)

    model = loaded.model
    vocab = loaded.config.vocab_size
    st = SamplingTensors.from_params([params] * vocab, [0] * vocab, "cpu", vocab_size=vocab)
    with torch.inference_mode():
        p1 = processed_probs(
            last_logits(model, [prompt]), SamplingTensors.from_params([params], [0], "cpu", vocab_size=vocab)
        )[0]
        p2 = processed_probs(last_logits(model, [prompt + [t] for t in range(vocab)]), st)  # [V, V]
    return (p1[:, None] * p2).sum(0).double().numpy()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True),
        SamplingParams(max_tokens=2, temperature=1.0, top_k=8, ignore_eos=True),
        SamplingParams(max_tokens=2, temperature=0.8, top_p=0.7, ignore_eos=True),
    ],
    ids=["temperature", "top_k", "top_p"],
)
def test_sampled_spec_follows_target_law(tmp_path_factory, make_small_vocab_engine, small_vocab, params):
    spec = SpeculativeConfig(
        drafter=str(
            random_drafter_dir(
                tmp_path_factory.mktemp("d"),
                small_vocab,
                num_heads=4,
                num_kv_heads=2,
                head_dim=16,
                intermediate_size=64,
                markov_rank=8,
            )
        )
    )
    engine = make_small_vocab_engine(max_num_seqs=256, speculative=spec, enable_prefix_cache=False)
    prompt = [1, 5, 9, 4, 12]
    num_samples = 20_000
    seeded = [SamplingParams(**{**_fields(params), "seed": s}) for s in range(num_samples)]
    second = np.array([r.token_ids[1] for r in run(engine, [prompt] * num_samples, seeded)])
    law = _second_token_law(small_vocab, prompt, params)
    observed = np.bincount(second, minlength=len(law)).astype(np.float64)
    expected = law * num_samples
    keep = expected >= 5  # merge rare cells into one
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert obs.sum() == num_samples
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    assert engine.stats().spec_verify_steps_total >= num_samples


def _fields(params: SamplingParams) -> dict:
    import dataclasses

    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
