"""Continuous batching must not change greedy results: batched equals one-at-a-time across
mixed prompt lengths, with chunked prefill and the prefix cache each on and off."""

from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.engine_driver import chat_ids, run

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(make_engine) -> list[list[int]]:
    engine = make_engine()
    # Mixed lengths: short single-turn prompts and long multi-turn ones, some sharing prefixes.
    return [chat_ids(engine, c) for c in CHAT_PROMPTS[:6] + CHAT_PROMPTS[15:20]]


@pytest.fixture(scope="module")
def one_at_a_time(make_engine, prompts) -> list[list[int]]:
    engine = make_engine(max_num_seqs=1, enable_prefix_cache=False, chunked_prefill=False)
    return [run(engine, [p], GREEDY)[0].token_ids for p in prompts]


@pytest.mark.parametrize("chunked_prefill", [True, False])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_batched_equals_one_at_a_time(make_engine, prompts, one_at_a_time, chunked_prefill, prefix_cache):
    # A small token budget forces long prompts into several chunks.
    engine = make_engine(
        max_num_seqs=8, max_num_batched_tokens=40, chunked_prefill=chunked_prefill, enable_prefix_cache=prefix_cache
    )
    results = run(engine, prompts, GREEDY)
    assert [r.token_ids for r in results] == one_at_a_time
    assert engine.kv.usage().used_slots == 0


def test_second_turn_reuses_first_turn_kv(make_engine):
    engine = make_engine(enable_prefix_cache=True)
    turn1 = [{"role": "user", "content": "Name a large animal that lives in the ocean."}]
    first = run(engine, [chat_ids(engine, turn1)], SamplingParams(max_tokens=32, temperature=0.0))[0]
    turn2 = turn1 + [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "How much does it weigh?"},
    ]
    hits_before = engine.stats().prefix_cache_hits_total
    second = run(engine, [chat_ids(engine, turn2)], SamplingParams(max_tokens=16, temperature=0.0))[0]
    cached = second.outputs[-1].num_cached_tokens
    assert cached >= len(chat_ids(engine, turn1)) - 1
    assert engine.stats().prefix_cache_hits_total - hits_before == cached
    cold = make_engine(enable_prefix_cache=False)
    assert (
        run(cold, [chat_ids(cold, turn2)], SamplingParams(max_tokens=16, temperature=0.0))[0].token_ids
        == second.token_ids
    )
