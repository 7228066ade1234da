"""The whole step loop (prefill, decode, mixed steps of both; with DSpark: draft, verify,
accept, commit, KV injection) runs under the sync guard, with either scheduling policy:
the only host/device synchronisation is the one permitted wait per step, on the previous
step's output copy."""

from __future__ import annotations

import pytest
import torch

from engine.config import SpeculativeConfig
from engine.runner.options import RunnerOptions
from engine.sampling_params import SamplingParams
from engine.sync_guard import HostSyncError, SyncGuard
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.conftest import random_drafter_dir
from tests.engine.engine_driver import chat_ids

MIXED = [
    SamplingParams(max_tokens=12, temperature=0.0),
    SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=3),
    SamplingParams(max_tokens=12, temperature=0.7, top_k=20, frequency_penalty=0.5, logprobs=2),
    SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.3, stop=("\n",), prompt_logprobs=2),
]


def _guarded_run(engine, prompts) -> tuple[int, int]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"g{i}", prompt, MIXED[i % len(MIXED)])
    steps = 0
    with SyncGuard("cpu") as guard:
        engine.attach_sync_guard(guard)
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    return steps, guard.waits


@pytest.mark.parametrize(
    ("speculative", "max_batch_size", "scheduling"),
    [(False, None, "mixed"), (False, None, "alternating"), (True, None, "mixed"), (True, 3, "mixed")],
    ids=["plain", "plain-alternating", "dspark", "dspark-capped"],  # capped: batches over 3 decode without drafting
)
def test_step_loop_passes_the_cpu_sync_guard(
    make_engine, tmp_path_factory, smollm, speculative, max_batch_size, scheduling
):
    spec = (
        SpeculativeConfig(
            drafter=str(random_drafter_dir(tmp_path_factory.mktemp("d"), smollm)), max_batch_size=max_batch_size
        )
        if speculative
        else None
    )
    engine = make_engine(max_num_batched_tokens=32, speculative=spec, scheduling=scheduling)
    prompts = [chat_ids(engine, c) for c in CHAT_PROMPTS[:4] + CHAT_PROMPTS[17:19]]
    steps, waits = _guarded_run(engine, prompts)
    # One wait per step that had a predecessor in flight: never more than one per step.
    assert 0 < waits <= steps
    assert (engine.stats().mixed_steps_total > 0) == (scheduling == "mixed")
    assert engine.kv.usage().used_slots == 0


def test_prefill_expansion_without_output_size_is_caught(make_engine):
    """The motivating bug: repeat_interleave without output_size reads the size back from the
    device. The guard must catch it in the prefill expansion."""
    engine = make_engine(runner_options=RunnerOptions(host_sized_expansion=False))
    engine.add_request("r", chat_ids(engine, CHAT_PROMPTS[0]), SamplingParams(max_tokens=2))
    with pytest.raises(HostSyncError, match="repeat_interleave"), SyncGuard("cpu") as guard:
        engine.attach_sync_guard(guard)
        engine.step()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize(
    ("speculative", "drafter_layers", "max_batch_size"),
    [(False, 1, None), (True, 1, None), (True, 2, None), (True, 1, 3)],
    ids=["plain", "dspark", "dspark-2-layers", "dspark-capped"],
)
def test_step_loop_passes_cuda_sync_debug_mode(tmp_path_factory, speculative, drafter_layers, max_batch_size):
    from tests.engine.gpu_models import gpu_engine

    engine = gpu_engine(
        tmp_path_factory.mktemp("gpu"),
        speculative=speculative,
        drafter_layers=drafter_layers,
        max_batch_size=max_batch_size,
    )
    prompts = [[1 + (7 * i + j) % 500 for j in range(40 + 13 * i)] for i in range(6)]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"g{i}", prompt, MIXED[i % len(MIXED)])
    steps = 0
    with SyncGuard(torch.device("cuda")) as guard:
        engine.attach_sync_guard(guard)
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    assert 0 < guard.waits <= steps
