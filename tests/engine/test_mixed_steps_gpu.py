"""Mixed steps on a GPU, through the Triton backend: a mixed step attends its decode rows with
the split-KV kernel and its chunks with the extend kernel (`AttentionMetadata.parts`), and
the tokens equal the alternating scheduler's, where every step is one kind. fp32, so that a
matmul's different row count in the two schedules cannot flip a greedy choice."""

from __future__ import annotations

import pytest
import torch

from engine.sampling_params import SamplingParams
from tests.engine.engine_driver import run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_mixed_equals_alternating_on_the_gpu(tmp_path_factory, speculative):
    from tests.engine.gpu_models import gpu_engine

    engines = {
        policy: gpu_engine(
            tmp_path_factory.mktemp(policy),
            speculative=speculative,
            dtype=torch.float32,
            scheduling=policy,
            max_num_batched_tokens=48,
            attention_backend="triton",
        )
        for policy in ("alternating", "mixed")
    }
    prompts = [[1 + (11 * i + 5 * j) % 500 for j in range(30 + 37 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    arrivals = [4 * i for i in range(len(prompts))]  # each prompt arrives while others decode
    results = {policy: run(engine, prompts, params, arrival_steps=arrivals) for policy, engine in engines.items()}
    assert [r.token_ids for r in results["mixed"]] == [r.token_ids for r in results["alternating"]]
    assert engines["mixed"].stats().mixed_steps_total > 0
    for engine in engines.values():
        assert engine.kv.usage().used_slots == 0
