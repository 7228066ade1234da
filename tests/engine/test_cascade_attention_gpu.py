"""Shared prefixes attended once (docs/design.md §4.9) on a GPU: requests that share a long
system prompt, served with and without the shared pass, give the same tokens, plain and
DSpark, alternating and mixed scheduling, with decode graphs (whose larger buckets capture
the shared pass). fp32, so that a different summation order cannot flip a greedy choice."""

from __future__ import annotations

import pytest
import torch

from engine.runner.options import RunnerOptions
from engine.sampling_params import SamplingParams
from tests.engine.engine_driver import run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]


@pytest.mark.parametrize("scheduling", ["alternating", "mixed"])
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_the_shared_pass_changes_no_token(tmp_path_factory, speculative, scheduling):
    from tests.engine.gpu_models import gpu_engine_from, gpu_model_dirs

    model_dir, drafter_dir = gpu_model_dirs(tmp_path_factory.mktemp("models"), speculative)
    engines = {
        cascade: gpu_engine_from(
            model_dir,
            drafter_dir,
            dtype=torch.float32,
            scheduling=scheduling,
            max_num_batched_tokens=256,
            attention_backend="triton",
            runner_options=RunnerOptions(cascade_attention=cascade),
        )
        for cascade in (False, True)
    }
    system = [1 + (7 * j) % 500 for j in range(400)]  # 400 shared tokens: P = 384
    prompts = [system + [3 + (13 * i + 5 * j) % 500 for j in range(10 + 23 * i)] for i in range(8)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    arrivals = [0] + [3 + 2 * i for i in range(len(prompts) - 1)]  # the rest hit the cached prompt
    results = {cascade: run(engine, prompts, params, arrival_steps=arrivals) for cascade, engine in engines.items()}
    assert [r.token_ids for r in results[True]] == [r.token_ids for r in results[False]]
    assert engines[True].runner.shared_prefix_steps > 0
    assert engines[False].runner.shared_prefix_steps == 0
    for engine in engines.values():
        assert engine.kv.usage().used_slots == 0
