"""The scheduler alone (host bookkeeping, a real KVManager, no model): under the mixed policy
a decoding request advances in every step while a long prompt is chunked; under the
alternating policy it waits for each chunk step. Prefixes another request is computing are
waited for, then taken from the cache.

Step outputs are the StepResult a runner would return (each decode row commits one token,
each chunk's KV length is its end), applied with the one-step lag of the engine loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.engine_setup import scheduling_policy
from engine.kv.manager import KVManager
from engine.kv.shared_prefix import MIN_DEFERRED_TOKENS
from engine.request import Request
from engine.runner.step_output import StepResult
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledStep, Scheduler

BUDGET = 32


def _scheduler(policy: str, page_size: int = 1, budget: int = BUDGET) -> Scheduler:
    kv = KVManager(
        num_slots=8192, page_size=page_size, max_rows=8, max_context=2048, enable_prefix_cache=True, device="cpu"
    )
    return Scheduler(
        kv,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        chunked_prefill=True,
        max_model_len=2048,
        step_width=1,
        policy=policy,  # type: ignore[arg-type]
    )


def _request(name: str, prompt: list[int], max_tokens: int = 1000) -> Request:
    return Request(name, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival_s=0.0, rng_key=0)


def _result(step: ScheduledStep) -> StepResult:
    """What the device would report: one token per decode row, a token per sampling chunk."""
    accept = [1] * len(step.decode) + [int(c.samples) for c in step.chunks]
    kv_len = [k + 1 for k in step.kv_before] + [c.end for c in step.chunks]
    return StepResult(
        tokens=np.full((len(accept), 1), 7, dtype=np.int64),
        accept_len=np.array(accept, dtype=np.int32),
        kv_len=np.array(kv_len, dtype=np.int32),
        logprob=None,
        top_ids=None,
        top_logprobs=None,
    )


class Loop:
    """Schedule, then apply the previous step's result (the engine's one-step lag)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.inflight: ScheduledStep | None = None
        self.steps: list[ScheduledStep] = []

    def step(self) -> ScheduledStep | None:
        step = self.scheduler.schedule()
        if self.inflight is not None:
            for req, _, count in self.scheduler.update_from_output(self.inflight, _result(self.inflight)):
                req.output_ids.extend([7] * count)
        self.inflight = step
        if step is not None:
            self.steps.append(step)
        return step


def _chunk_long_prompt_beside_a_decoder(policy: str) -> tuple[Request, list[ScheduledStep]]:
    scheduler = _scheduler(policy)
    loop = Loop(scheduler)
    decoder = _request("decoder", list(range(1, 9)))
    scheduler.add(decoder)
    loop.step()
    loop.step()
    assert decoder in scheduler.decoding
    long = _request("long", list(range(100, 100 + 10 * BUDGET)))
    scheduler.add(long)
    chunking: list[ScheduledStep] = []
    while long.num_computed < len(long.prompt_ids):
        step = loop.step()
        assert step is not None
        chunking.append(step)
    return decoder, chunking


def test_mixed_policy_decodes_in_every_step_while_a_prompt_is_chunked():
    decoder, steps = _chunk_long_prompt_beside_a_decoder("mixed")
    assert all(decoder in step.decode for step in steps)
    assert all(step.kind == "mixed" for step in steps)
    # the decode row's token comes out of the budget: each chunk is BUDGET - 1 tokens
    assert all(step.num_tokens + len(step.decode) <= BUDGET for step in steps)
    assert sum(step.num_tokens for step in steps) == 10 * BUDGET


def test_alternating_policy_makes_the_decoder_wait_for_chunk_steps():
    decoder, steps = _chunk_long_prompt_beside_a_decoder("alternating")
    kinds = [step.kind for step in steps]
    assert "mixed" not in kinds
    assert kinds.count("prefill") == 10  # whole-budget chunks
    assert sum(decoder in step.decode for step in steps) < len(steps) // 2 + 1


@pytest.mark.parametrize("page_size", [1, 16])
def test_requests_sharing_a_prefix_wait_for_its_pages(page_size: int):
    scheduler = _scheduler("mixed", page_size)
    loop = Loop(scheduler)
    shared = list(range(500, 500 + 4 * BUDGET))
    first, second = _request("a", shared + [1, 2, 3]), _request("b", shared + [4, 5])
    scheduler.add(first)
    scheduler.add(second)
    while first.num_computed < len(shared):
        loop.step()
        assert second in scheduler.waiting, "admitted while its prefix was still being computed"
    loop.step()
    assert second.status.value == "prefilling" or second in scheduler.decoding
    aligned = len(shared) - len(shared) % page_size
    assert second.prompt_cache_hit == aligned  # attached to the first request's pages
    while scheduler.prefilling:
        loop.step()
    computed = sum(step.num_tokens for step in loop.steps)
    assert computed == len(first.prompt_ids) + len(second.prompt_ids) - aligned


def test_short_shared_prefixes_are_not_waited_for():
    scheduler = _scheduler("mixed", budget=4 * MIN_DEFERRED_TOKENS)
    shared = list(range(500, 500 + MIN_DEFERRED_TOKENS - 1))
    scheduler.add(_request("a", shared + [1]))
    scheduler.add(_request("b", shared + [2]))
    step = scheduler.schedule()
    assert step is not None and len(step.chunks) == 2


def test_auto_scheduling_is_mixed_on_a_gpu_and_alternating_on_cpu():
    assert scheduling_policy("auto", torch.device("cuda", 0)) == "mixed"
    assert scheduling_policy("auto", torch.device("cpu")) == "alternating"
    assert scheduling_policy("alternating", torch.device("cuda", 0)) == "alternating"
    assert scheduling_policy("mixed", torch.device("cpu")) == "mixed"
