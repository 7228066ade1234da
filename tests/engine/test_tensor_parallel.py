"""Tensor parallelism over gloo on CPU: two ranks, each running the same engine loop over
its half of the heads and MLP columns, produce the same greedy tokens as one process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from tests.engine.engine_driver import run

PROMPTS = [[1, 17, 300, 42, 9], list(range(3, 40)), [5] * 12]
PARAMS = [
    SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=0.8, seed=11, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
]


def _config(model_dir: Path, tp: int) -> EngineConfig:
    return EngineConfig(
        model=str(model_dir),
        device="cpu",
        tensor_parallel_size=tp,
        max_model_len=512,
        kv_cache_memory_bytes=16 << 20,
        max_num_batched_tokens=16,
    )


def _rank_main(rank: int, model_dir: str, port: int, results: dict) -> None:
    from engine.distributed.parallel import destroy_tensor_parallel, init_tensor_parallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_tensor_parallel(2, rank, backend="gloo")
    try:
        engine = EngineCore(_config(Path(model_dir), 2))
        results[rank] = [r.token_ids for r in run(engine, PROMPTS, PARAMS)]
    finally:
        destroy_tensor_parallel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp2_equals_tp1(tiny_model_dir):
    single = [r.token_ids for r in run(EngineCore(_config(tiny_model_dir, 1)), PROMPTS, PARAMS)]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(str(tiny_model_dir), _free_port(), results), nprocs=2, join=True)
        assert results[0] == results[1] == single
