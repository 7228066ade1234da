"""Grammar rows replay the captured decode step (docs/design.md §2.8, §4.6): a batch that
mixes grammar and plain greedy rows gives the same tokens with CUDA graphs as eagerly, plain
and DSpark, and the constrained rows follow their grammar."""

from __future__ import annotations

import re

import pytest
import torch

from engine.sampling_params import SamplingParams
from engine.structured import GrammarSpec
from tests.engine.engine_driver import run

# The test models' word vocabulary (w0 ... w508): tokens "w1" ... "w4" alone can spell this.
PATTERN = r"(w[1-4]){2,12}"
PROMPTS = [[1, 5 + i, 40 + 3 * i, 90 + i, 7] for i in range(6)]


def _params() -> list[SamplingParams]:
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=24, temperature=0.0, grammar=GrammarSpec("regex", PATTERN))
    return [constrained if i % 2 == 0 else plain for i in range(len(PROMPTS))]


def _outputs(tmp, speculative: bool, cuda_graphs: bool) -> list[list[int]]:
    from tests.engine.gpu_models import gpu_engine

    engine = gpu_engine(tmp, speculative, cuda_graphs=cuda_graphs)
    assert (engine.runner.graphs is not None) == cuda_graphs
    outputs = run(engine, PROMPTS, _params())
    for out, params in zip(outputs, _params(), strict=True):
        if params.grammar is not None:
            assert re.fullmatch(PATTERN, out.text.replace(" ", "")), out.text
    assert engine.kv.usage().used_slots == 0
    return [o.token_ids for o in outputs]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_grammar_rows_replay_the_graph_with_the_eager_tokens(tmp_path_factory, speculative):
    eager = _outputs(tmp_path_factory.mktemp("eager"), speculative, cuda_graphs=False)
    graphed = _outputs(tmp_path_factory.mktemp("graphed"), speculative, cuda_graphs=True)
    assert graphed == eager
