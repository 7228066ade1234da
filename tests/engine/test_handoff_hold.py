"""Holding a handed-off request's KV in place (docs/design.md §5.7): `hold_kv` keeps the slots,
whose contents are the KV `export_kv` would have copied; a decode engine given that KV decodes
what an undisturbed engine does; `release_held` frees the slots, and a hold no receiver claims
is freed after its time."""

from __future__ import annotations

import time

import torch

from engine.sampling_params import SamplingParams
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.engine_driver import chat_ids, run

PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def prefill_to_handoff(engine, request_id: str, prompt: list[int]) -> None:
    engine.add_request(request_id, prompt, PARAMS, prefill_only=True)
    while not any(o.finish_reason == "handoff" for o in engine.step() if o.request_id == request_id):
        pass


def test_held_slots_carry_the_kv_and_decode_like_an_undisturbed_run(make_tiny_engine):
    prefill, decode, whole = (make_tiny_engine(max_num_seqs=4) for _ in range(3))
    prompt = [1 + (13 * i) % 400 for i in range(70)]
    expected = run(whole, [prompt], PARAMS)[0].token_ids

    prefill_to_handoff(prefill, "held", prompt)
    held = prefill.hold_kv("held", hold_s=60.0)
    assert "held" not in prefill.requests and prefill.num_held == 1
    assert prefill.kv.usage().used_slots >= held.kv_len  # still allocated
    target_pool, draft_pool = prefill.kv_pools()
    assert draft_pool is None
    slots = torch.from_numpy(held.slots)
    handoff = held.with_kv(target_pool.read(slots), None)

    decode.add_decode_request("held", handoff)
    outputs = []
    while decode.has_unfinished_requests():
        outputs.extend(o for o in decode.step() if o.request_id == "held")
    assert list(outputs[-1].token_ids) == expected

    prefill.release_held("held")
    assert prefill.num_held == 0 and prefill.kv.usage().used_slots == 0
    prefill.release_held("held")  # a second report (a retried message) is harmless


def test_a_hold_nobody_claims_is_freed_after_its_time(make_tiny_engine):
    engine = make_tiny_engine(max_num_seqs=4)
    prompt = chat_ids(engine, CHAT_PROMPTS[0])
    prefill_to_handoff(engine, "lost", prompt)
    engine.hold_kv("lost", hold_s=0.2)
    assert engine.release_expired_holds() == [] and engine.kv.usage().used_slots > 0
    time.sleep(0.25)
    assert engine.release_expired_holds() == ["lost"]
    assert engine.num_held == 0 and engine.kv.usage().used_slots == 0
