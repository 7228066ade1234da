"""Bad input gets a clear ValueError naming the field and loses nothing; aborts at any time
free everything; a long churn of requests leaves no slot or memory behind."""

from __future__ import annotations

import random
import resource

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.engine_driver import run


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ([], "prompt"),
        ("not token ids", "prompt"),
        ([1, -4, 2], "prompt"),
        ([1, 10**9], "prompt"),
        ([1] * 5000, "prompt"),  # longer than max_model_len
    ],
)
def test_bad_prompt_is_rejected_and_engine_keeps_serving(make_tiny_engine, prompt, field):
    engine = make_tiny_engine()
    with pytest.raises(ValueError, match=field):
        engine.add_request("bad", prompt, SamplingParams(max_tokens=4))
    assert "bad" not in engine.requests
    assert run(engine, [[1, 5, 7]], SamplingParams(max_tokens=4, temperature=0.0))[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty"),
        ({"presence_penalty": -9.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": (3,)}, "stop"),
        ({"stop": ("",)}, "stop"),
        ({"stop_token_ids": ("x",)}, "stop_token_ids"),
        ({"logprobs": 99}, "logprobs"),
        ({"seed": "abc"}, "seed"),
    ],
)
def test_bad_sampling_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_duplicate_request_id_is_rejected(make_tiny_engine):
    engine = make_tiny_engine()
    engine.add_request("same", [1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("same", [1, 2, 3], SamplingParams(max_tokens=2))
    run(engine, [[4, 5]], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()


def test_abort_at_every_stage_frees_everything(make_tiny_engine):
    engine = make_tiny_engine(max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    for stage in range(12):  # abort after `stage` steps: waiting, mid-prefill, decoding
        engine.add_request("victim", list(range(3, 60)), params)
        engine.add_request("other", list(range(5, 20)), params)
        for _ in range(stage):
            engine.step()
        engine.abort_request("victim")
        outs = []
        while engine.has_unfinished_requests():
            outs.extend(engine.step())
        finals = {o.request_id: o for o in outs if o.finished}
        assert finals["victim"].finish_reason == "abort"
        assert finals["other"].finish_reason == "length" and len(finals["other"].token_ids) == 30
        assert engine.kv.usage().used_slots == 0
        assert engine.scheduler.num_running == engine.scheduler.num_waiting == 0


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_thousand_requests_with_random_aborts_leave_nothing_behind(make_tiny_engine):
    engine = make_tiny_engine(max_num_seqs=32, max_num_batched_tokens=256, kv_cache_memory_bytes=4 << 20)
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size

    def churn(n: int, prefix: str) -> None:
        live: list[str] = []
        for i in range(n):
            rid = f"{prefix}{i}"
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 60))]
            params = SamplingParams(
                max_tokens=rng.randint(1, 24),
                temperature=rng.choice([0.0, 0.8]),
                seed=rng.randrange(1 << 30),
                ignore_eos=rng.random() < 0.5,
            )
            engine.add_request(rid, prompt, params)
            live.append(rid)
            if rng.random() < 0.3:
                engine.abort_request(rng.choice(live))
            if rng.random() < 0.5:
                engine.step()
        while engine.has_unfinished_requests():
            engine.step()

    churn(200, "warm")  # reach the steady state of caches and allocators first
    rss_before = _rss_mib()
    churn(1000, "r")
    assert engine.kv.usage().used_slots == 0
    assert not engine.requests and engine.scheduler.num_running == engine.scheduler.num_waiting == 0
    assert engine.kv.table.num_free_rows == engine.kv.table.max_rows
    assert _rss_mib() - rss_before < 64, "process memory grew over 1,000 requests"
