"""Prompt logprobs (docs/design.md §2.4) against one full forward of the same model in float32:
whole prompts, chunked prefill, logits cut into small slices, mixed batches, the prefix cache,
a DSpark engine, scoring requests (max_tokens 0), preemption and the KV hand-off."""

from __future__ import annotations

import pytest
import torch

from engine.config import SpeculativeConfig
from engine.outputs import TokenLogprob
from engine.runner.options import RunnerOptions
from engine.sampling_params import SamplingParams
from tests.engine.conftest import random_drafter_dir
from tests.engine.engine_driver import Finished, run
from tests.models.model_harness import sequence_logits

TOL = 1e-4
TEXTS = [
    "The quick brown fox jumps over the lazy dog because it wanted to see what lay beyond the fence, "
    "and the dog, being lazy, did not follow it into the woods.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "1, 2, 3, 4, 5,",
]


def encode(engine, text: str) -> list[int]:
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


def prompt_logprobs_of(finished: Finished) -> tuple[TokenLogprob, ...]:
    carrying = [o.prompt_logprobs for o in finished.outputs if o.prompt_logprobs is not None]
    assert len(carrying) == 1, "prompt logprobs come once"
    assert finished.outputs[0].prompt_logprobs is not None, "on the first output"
    return carrying[0]


def assert_matches_reference(model, prompt: list[int], entries: tuple[TokenLogprob, ...], top_n: int) -> None:
    reference = torch.log_softmax(sequence_logits(model, prompt).float(), dim=-1)  # [P, V]
    assert [e.token_id for e in entries] == prompt[1:]
    got = torch.tensor([e.logprob for e in entries])
    expected = reference[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
    for position, entry in enumerate(entries):
        assert len(entry.top) == top_n
        values = torch.tensor([lp for _, lp in entry.top])
        torch.testing.assert_close(values, reference[position].topk(top_n).values, atol=TOL, rtol=0)
        # each alternative carries its own logprob (robust to near-ties swapping places)
        ids = torch.tensor([t for t, _ in entry.top], dtype=torch.int64)
        torch.testing.assert_close(reference[position, ids], values, atol=TOL, rtol=0)


@pytest.mark.parametrize(
    ("budget", "slice_rows"),
    [(2048, None), (16, None), (16, 5)],
    ids=["whole-prompt", "chunked", "chunked-small-slices"],
)
def test_prompt_logprobs_match_a_full_forward(make_engine, smollm, budget, slice_rows):
    engine = make_engine(
        max_num_batched_tokens=budget, runner_options=RunnerOptions(prompt_logprob_slice_rows=slice_rows)
    )
    prompts = [encode(engine, t) for t in TEXTS]
    params = [
        SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=3, logprobs=1),
        SamplingParams(max_tokens=2, temperature=0.0),  # batched with the others, scores nothing
        SamplingParams(max_tokens=2, temperature=0.8, seed=1, prompt_logprobs=0),
    ]
    results = run(engine, prompts, params)
    assert_matches_reference(smollm.model, prompts[0], prompt_logprobs_of(results[0]), 3)
    assert all(o.prompt_logprobs is None for o in results[1].outputs)
    assert_matches_reference(smollm.model, prompts[2], prompt_logprobs_of(results[2]), 0)
    plain = run(engine, [prompts[0]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert results[0].token_ids == plain.token_ids  # scoring the prompt changes no output
    assert engine.kv.usage().used_slots == 0


def test_a_shared_prefix_is_computed_again_for_its_logprobs(make_engine, smollm):
    engine = make_engine(max_num_batched_tokens=32)
    first = encode(engine, TEXTS[0])
    second = first[:40] + encode(engine, " The end.")
    run(engine, [first], SamplingParams(max_tokens=1, temperature=0.0))  # caches the prefix
    scored = run(engine, [second], SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2))[0]
    assert scored.outputs[0].num_cached_tokens == 0
    assert_matches_reference(smollm.model, second, prompt_logprobs_of(scored), 2)
    again = run(engine, [second], SamplingParams(max_tokens=2, temperature=0.0))[0]
    assert again.outputs[0].num_cached_tokens > 0  # without prompt logprobs the cache serves it
    assert again.token_ids == scored.token_ids


def test_scoring_request_generates_nothing(make_engine, smollm):
    engine = make_engine()
    prompt = encode(engine, TEXTS[1])
    result = run(engine, [prompt], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    assert result.finish_reason == "length" and result.token_ids == [] and result.text == ""
    assert len(result.outputs) == 1 and result.outputs[0].finished
    assert_matches_reference(smollm.model, prompt, prompt_logprobs_of(result), 1)
    assert engine.generation_tokens_total == 0 and engine.kv.usage().used_slots == 0


def test_one_token_prompt_has_no_entries(make_engine):
    engine = make_engine()
    result = run(engine, [[504]], SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2))[0]
    assert prompt_logprobs_of(result) == ()


def test_dspark_engine_scores_the_prompt_alike(make_engine, smollm, tmp_path_factory):
    drafter = random_drafter_dir(tmp_path_factory.mktemp("drafter"), smollm)
    engine = make_engine(max_num_batched_tokens=16, speculative=SpeculativeConfig(drafter=str(drafter)))
    prompt = encode(engine, TEXTS[0])
    result = run(engine, [prompt], SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=2))[0]
    assert_matches_reference(smollm.model, prompt, prompt_logprobs_of(result), 2)


def test_preempted_requests_report_each_entry_once(make_tiny_engine):
    """A KV pool too small for four growing requests preempts some; their recompute must not
    add prompt logprobs twice, and what they report equals an engine with room for all."""
    prompts = [[1 + (13 * i + 7 * j) % 900 for j in range(30 + 5 * i)] for i in range(4)]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    roomy = run(make_tiny_engine(max_model_len=256), prompts, params)
    tight_engine = make_tiny_engine(max_model_len=128, kv_cache_memory_bytes=300 * 512)
    tight = run(tight_engine, prompts, params)
    assert tight_engine.scheduler.num_preemptions > 0
    for prompt, a, b in zip(prompts, roomy, tight, strict=True):
        entries = prompt_logprobs_of(b)
        assert len(entries) == len(prompt) - 1
        assert [e.token_id for e in entries] == [e.token_id for e in prompt_logprobs_of(a)]
        torch.testing.assert_close(
            torch.tensor([e.logprob for e in entries]),
            torch.tensor([e.logprob for e in prompt_logprobs_of(a)]),
            atol=TOL,
            rtol=0,
        )
        assert a.token_ids == b.token_ids


def test_handoff_carries_no_prompt_logprobs_to_the_decode_engine(make_engine, smollm):
    prefill, decode = make_engine(max_num_batched_tokens=16), make_engine()
    prompt = encode(prefill, TEXTS[1])
    params = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=1)
    prefill.add_prefill_request("h", prompt, params)
    first = [o for _ in range(20) for o in prefill.step() if o.request_id == "h"]
    assert [o.finish_reason for o in first] == ["handoff"]
    assert first[0].prompt_logprobs is not None
    assert_matches_reference(smollm.model, prompt, first[0].prompt_logprobs, 1)
    handoff = prefill.export_kv("h")
    assert handoff.params.prompt_logprobs is None and handoff.params.max_tokens == 4
    decode.add_decode_request("h", handoff)
    rest = [o for o in decode.run_until_idle() if o.request_id == "h"]
    assert rest[-1].finished and all(o.prompt_logprobs is None for o in rest)
    whole = run(make_engine(), [prompt], params)[0]
    assert list(first[0].token_ids) + [t for o in rest for t in o.new_token_ids] == whole.token_ids


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1, "prompt_logprobs": 1}, "max_tokens"),
    ],
)
def test_bad_prompt_logprobs_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
