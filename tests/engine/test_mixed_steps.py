"""Mixed steps change no result: prompts arriving while others decode give the same tokens
under the mixed and the alternating scheduler (plain, DSpark, DSpark over its batch cap),
DSpark's draft KV of a prompt prefilled beside decode rows is the one a prefill alone
injects, and a prefix shared by requests submitted together is computed once."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import SpeculativeConfig
from engine.sampling_params import SamplingParams
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.conftest import random_drafter_dir
from tests.engine.engine_driver import chat_ids, run

PARAMS = [
    SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=0.0, logprobs=2, ignore_eos=True),
    SamplingParams(max_tokens=9, temperature=0.0, frequency_penalty=0.4, ignore_eos=True),
]


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory, tiny) -> SpeculativeConfig:
    return SpeculativeConfig(drafter=str(random_drafter_dir(tmp_path_factory.mktemp("drafter"), tiny, gamma=4)))


@pytest.mark.parametrize("mode", ["plain", "dspark", "dspark-capped"])
def test_mixed_equals_alternating_with_prompts_arriving_during_decode(make_tiny_engine, tiny_spec, mode):
    spec = {"plain": None, "dspark": tiny_spec, "dspark-capped": dataclasses.replace(tiny_spec, max_batch_size=2)}
    engines = {
        policy: make_tiny_engine(max_num_seqs=8, max_num_batched_tokens=32, scheduling=policy, speculative=spec[mode])
        for policy in ("alternating", "mixed")
    }
    prompts = [chat_ids(engines["mixed"], c) for c in CHAT_PROMPTS[:3] + CHAT_PROMPTS[15:18]]
    params = [PARAMS[i % len(PARAMS)] for i in range(len(prompts))]
    arrivals = [3 * i for i in range(len(prompts))]  # each prompt arrives while others decode
    results = {policy: run(engine, prompts, params, arrival_steps=arrivals) for policy, engine in engines.items()}
    # Over the cap a step drafts or not by its batch size, which the policies make differ;
    # a sampled row's draw depends on that (either law is the target's), a greedy row's not.
    same = [i for i, p in enumerate(params) if p.greedy or mode != "dspark-capped"]
    assert [results["mixed"][i].token_ids for i in same] == [results["alternating"][i].token_ids for i in same]
    for i in same:  # a logprob per committed token, whichever rows the step held
        for policy in results:
            outputs = results[policy][i].outputs
            want = len(results[policy][i].token_ids) if params[i].logprobs else 0
            assert sum(len(o.new_logprobs) for o in outputs) == want
    mixed, alternating = engines["mixed"].stats(), engines["alternating"].stats()
    assert mixed.mixed_steps_total > 0 and alternating.mixed_steps_total == 0
    assert mixed.prefill_tokens_computed_total == alternating.prefill_tokens_computed_total
    for engine in engines.values():
        assert engine.kv.usage().used_slots == 0


def test_dspark_injects_draft_kv_for_prompts_prefilled_beside_decode_rows(make_engine):
    """SmolLM2 and its shipped drafter (acceptance well above zero): a prompt whose prefill
    rides in mixed steps next to a decoding request gets the draft KV a prefill alone
    injects, and then accepts exactly as many drafts per verify as it does alone."""
    spec = SpeculativeConfig()
    prompt_ids = chat_ids(make_engine(), CHAT_PROMPTS[4])
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    mixed = make_engine(max_num_batched_tokens=16, scheduling="mixed", speculative=spec)
    mixed.add_request("decoding", chat_ids(mixed, CHAT_PROMPTS[0]), SamplingParams(max_tokens=40, ignore_eos=True))
    while not mixed.requests["decoding"].output_ids:
        mixed.step()
    mixed.add_request("late", prompt_ids, params)
    while mixed.requests["late"].kv_len < len(prompt_ids):
        mixed.step()
    assert mixed.stats().mixed_steps_total >= len(prompt_ids) // 16
    late = mixed.requests["late"]
    _, draft = mixed.runner.export_kv(late)

    alone = make_engine(max_num_batched_tokens=16, speculative=spec)
    alone.add_request("late", prompt_ids, params)
    while alone.requests["late"].kv_len < len(prompt_ids):
        alone.step()
    _, expected = alone.runner.export_kv(alone.requests["late"])
    assert draft is not None and expected is not None
    n = len(prompt_ids)
    torch.testing.assert_close(draft[:, :, :n], expected[:, :, :n], atol=1e-4, rtol=1e-4)

    finals = {}
    for name, engine in (("mixed", mixed), ("alone", alone)):
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == "late" and out.finished:
                    finals[name] = out
    assert finals["mixed"].token_ids == finals["alone"].token_ids
    assert finals["mixed"].spec == finals["alone"].spec
    assert finals["alone"].spec.accepted_tokens > 0


@pytest.mark.parametrize("scheduling", ["mixed", "alternating"])
def test_shared_prefix_submitted_together_is_computed_once(make_tiny_engine, scheduling):
    shared = [1 + (17 * i) % 900 for i in range(300)]
    suffixes = [[1000 + 7 * r + j for j in range(5 + 3 * r)] for r in range(4)]
    prompts = [shared + suffix for suffix in suffixes]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    together = make_tiny_engine(max_num_seqs=8, max_num_batched_tokens=64, scheduling=scheduling)
    got = run(together, prompts, params)
    stats = together.stats()
    assert stats.prefill_tokens_computed_total == len(shared) + sum(len(s) for s in suffixes)
    assert stats.prefix_cache_hits_total == len(shared) * (len(prompts) - 1)
    one_at_a_time = make_tiny_engine(max_num_seqs=1, enable_prefix_cache=False)
    expected = [run(one_at_a_time, [p], params)[0].token_ids for p in prompts]
    assert [g.token_ids for g in got] == expected
    assert together.kv.usage().used_slots == 0
