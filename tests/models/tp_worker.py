"""One tensor-parallel rank of test_tensor_parallel (a module of its own so that spawned
processes import little)."""

from __future__ import annotations

from pathlib import Path

import torch
from model_harness import greedy_generate

from engine.distributed.parallel import destroy_tensor_parallel, init_tensor_parallel, tp_rank, tp_size
from engine.loader.load import build_model, load_weights, open_checkpoint


def run_rank(
    rank: int, world: int, init_file: str, model_dirs: list[str], prompt: list[int], steps: int, out_dir: str
) -> None:
    torch.set_num_threads(1)
    init_tensor_parallel(world, rank, backend="gloo", init_method=f"file://{init_file}")
    try:
        assert (tp_rank(), tp_size()) == (rank, world)
        results = {}
        for model_dir in model_dirs:
            checkpoint = open_checkpoint(model_dir)
            model = build_model(checkpoint.config)
            load_weights(model, checkpoint, progress=False)
            generated = greedy_generate(model, prompt, steps)
            attn = model.model.layers[0].self_attn
            results[model_dir] = {
                "tokens": generated.tokens,
                "logits": torch.stack(generated.logits),
                "local_heads": (attn.num_heads, attn.num_kv_heads),
            }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        destroy_tensor_parallel()
