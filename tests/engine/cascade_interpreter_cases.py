"""Shared prefixes attended once (docs/design.md §4.9) through the whole engine on CPU: the
Triton attention backend under TRITON_INTERPRET=1, so the host's search for shared keys, the
metadata of every forward kind (decode rows, DSpark drafter blocks and verify windows, chunks,
mixed steps) and the kernels run as on a GPU, minus graphs. Requests that share a 272-token
system prompt (the prefix cache holds it once; pages of 16) decode the same tokens with the
shared pass and without it, in fp32.

Not collected by a plain `pytest` run (the name lacks `test_`): test_cascade_interpreter.py
runs this file in a child process with TRITON_INTERPRET=1 (tests/triton_interpreter.py says
why the variable must be set before triton is imported).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.conftest import random_drafter_dir, save_random_llama, save_word_tokenizer
from tests.engine.engine_driver import run
from tests.triton_interpreter import require_interpreter

require_interpreter()

from engine.config import EngineConfig, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.runner.options import RunnerOptions  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

WORDS = 200


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("cascade-llama")
    save_word_tokenizer(out, [f"w{i}" for i in range(WORDS)])
    model_dir = save_random_llama(
        out, seed=3, weight_std=0.15, vocab_size=WORDS + 3, max_position_embeddings=1024, tie_word_embeddings=True
    )
    loaded = load_model(str(model_dir), dtype=torch.float32, device="cpu", progress=False)
    return model_dir, random_drafter_dir(tmp_path_factory.mktemp("cascade-drafter"), loaded, gamma=4)


def engine(model_dir: Path, drafter_dir: Path | None, scheduling: str, cascade: bool) -> EngineCore:
    loaded = load_model(str(model_dir), dtype=torch.float32, device="cpu", progress=False)
    config = EngineConfig(
        model=str(model_dir),
        device="cpu",
        dtype="float32",
        attention_backend="triton",
        page_size=16,
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=96,
        kv_cache_memory_bytes=64 << 20,
        scheduling=scheduling,  # type: ignore[arg-type]
        speculative=None if drafter_dir is None else SpeculativeConfig(drafter=str(drafter_dir)),
    )
    options = RunnerOptions(cascade_attention=cascade)
    return EngineCore(config, parts=build_engine_parts(config, loaded=loaded, runner_options=options))


@pytest.mark.parametrize(("scheduling", "speculative"), [("alternating", False), ("mixed", False), ("mixed", True)])
def test_the_shared_pass_changes_no_token(model_dirs: tuple[Path, Path], scheduling: str, speculative: bool):
    model_dir, drafter_dir = model_dirs
    engines = {
        cascade: engine(model_dir, drafter_dir if speculative else None, scheduling, cascade)
        for cascade in (False, True)
    }
    system = [3 + (7 * j) % WORDS for j in range(272)]  # the shared keys: 256 of them (ALIGN 128)
    prompts = [system + [3 + (13 * i + 5 * j) % WORDS for j in range(4 + 9 * i)] for i in range(5)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    arrivals = [0, 3, 4, 5, 6]  # the first computes the prompt; the rest attach to its pages
    results = {cascade: run(e, prompts, params, arrival_steps=arrivals) for cascade, e in engines.items()}
    assert [r.token_ids for r in results[True]] == [r.token_ids for r in results[False]]
    assert engines[True].runner.shared_prefix_steps > 0
    assert engines[False].runner.shared_prefix_steps == 0
    if scheduling == "mixed":
        assert engines[True].stats().mixed_steps_total > 0
    for e in engines.values():
        assert e.kv.usage().used_slots == 0
