"""Prefill and mixed forwards replayed as piecewise CUDA graphs (engine/runner/piecewise_graphs.py)
give the tokens of the same forwards launched eagerly: plain and DSpark (whose drafter reads
the residual streams the pieces capture), alternating and mixed scheduling, with prompts whose
chunks land in several token-count buckets. fp32, so that a matmul over a bucket's padded row
count cannot flip a greedy choice."""

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

PROMPTS = [[1 + (11 * i + 5 * j) % 500 for j in range(7 + 41 * i)] for i in range(7)]
PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("scheduling", ["alternating", "mixed"])
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_piecewise_graphs_equal_eager_forwards(tmp_path_factory, speculative, scheduling):
    from tests.engine.gpu_models import gpu_engine_from, gpu_model_dirs

    model_dir, drafter_dir = gpu_model_dirs(tmp_path_factory.mktemp("models"), speculative)
    results, engines = {}, {}
    for graphed in (False, True):
        engine = gpu_engine_from(
            model_dir,
            drafter_dir,
            dtype=torch.float32,
            runner_options=RunnerOptions(piecewise_extend_graphs=graphed),
            scheduling=scheduling,
            max_num_batched_tokens=160,
            attention_backend="triton",
        )
        assert (engine.runner.piecewise is not None) == graphed
        arrivals = [3 * i for i in range(len(PROMPTS))]  # prompts arrive while others decode
        results[graphed] = [r.token_ids for r in run(engine, PROMPTS, PARAMS, arrival_steps=arrivals)]
        engines[graphed] = engine
    assert results[True] == results[False]
    for engine in engines.values():
        assert engine.kv.usage().used_slots == 0
