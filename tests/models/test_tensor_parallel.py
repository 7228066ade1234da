"""TP=2 on CPU (gloo, two spawned processes) gives the greedy tokens and logits of TP=1, for
split KV heads, KV heads replicated across ranks (fewer KV heads than ranks), q/k/v and
row-parallel biases, and a vocabulary that does not divide evenly (padded shards)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from model_harness import greedy_generate
from random_models import save_random_hf_model
from tp_worker import run_rank

from engine.loader.load import build_model, load_weights, open_checkpoint

CASES = {
    "qwen3": dict(family="qwen3", expected_local_heads=(2, 1)),  # 4 q / 2 kv heads split
    "llama3-kv1": dict(family="llama3", num_key_value_heads=1, expected_local_heads=(2, 1)),  # kv replicated
    "qwen2-odd-vocab": dict(family="qwen2", vocab_size=383, expected_local_heads=(2, 1)),  # padded vocab
}
TIMEOUT_S = 300


def test_tp2_matches_tp1(tmp_path):
    prompt = torch.randint(0, 383, (11,), generator=torch.Generator().manual_seed(0)).tolist()
    steps = 12
    model_dirs, reference = [], {}
    for name, case in CASES.items():
        options = {k: v for k, v in case.items() if k not in ("family", "expected_local_heads")}
        directory = tmp_path / name
        save_random_hf_model(directory, case["family"], **options)
        checkpoint = open_checkpoint(str(directory))
        model = build_model(checkpoint.config)
        load_weights(model, checkpoint, progress=False)
        reference[str(directory)] = greedy_generate(model, prompt, steps)
        model_dirs.append(str(directory))

    context = mp.spawn(
        run_rank,
        args=(2, str(tmp_path / "rendezvous"), model_dirs, prompt, steps, str(tmp_path)),
        nprocs=2,
        join=False,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"tensor-parallel workers did not finish within {TIMEOUT_S} s")

    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for (name, case), model_dir in zip(CASES.items(), model_dirs, strict=True):
            ours, ref = results[model_dir], reference[model_dir]
            assert ours["local_heads"] == case["expected_local_heads"], name
            assert ours["tokens"] == ref.tokens, f"{name}: TP=2 rank {rank} tokens differ from TP=1"
            diff = float((ours["logits"] - torch.stack(ref.logits)).abs().max())
            assert diff < 1e-4, f"{name}: TP=2 rank {rank} logits differ from TP=1 by {diff}"
