"""Decode steps with and without the shared pass (docs/design.md §4.9), side by side in one run.

    python benchmarks/cascade_decode.py [--batches 16,64,256] [--shared 0,2048] [--own-tokens 64]
        [--steps 64] [--out results.json]

A Llama-3-8B-shaped model with random weights (benchmarks/engine_gpu.py). Per batch B and
shared length S: B requests whose prompts are the same S token ids then `own-tokens` of their
own (S = 0: nothing shared, the cost of the shared pass's bookkeeping when it finds nothing),
decoded greedily with CUDA graphs; ms per decode step over `steps` steps, with the shared pass
(`cascade`) and without it (`own-keys`), each on a fresh engine, alternating. The memory floor
per step is the weight bytes plus the KV bytes a step must read, over the measured copy rate:
every row's whole context (`floor, per row`) and the shared keys counted once (`floor, once`).
`+graph MB`: what the engine with the shared pass reserves on the device beyond the one
without it once built (its decode graphs are captured twice from 8 rows on).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_gpu import (  # noqa: E402
    LLAMA3_8B,
    ceilings,
    engine_for,
    random_model,
    timed_decode_steps,
    word_tokenizer,
)
from engine.core import EngineCore  # noqa: E402
from engine.loader.load import LoadedModel  # noqa: E402
from engine.loader.resolve import ModelSource  # noqa: E402
from engine.runner.options import RunnerOptions  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


def step_ms(engine: EngineCore, batch: int, shared: int, own: int, steps: int) -> float:
    """Mean ms per decode step of `batch` requests sharing `shared` prompt tokens."""
    gen = torch.Generator().manual_seed(batch + shared)
    vocab = engine.model_config.vocab_size
    system = torch.randint(3, vocab, (shared,), generator=gen).tolist()
    params = SamplingParams(max_tokens=steps + 40, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", system + torch.randint(3, vocab, (own,), generator=gen).tolist(), params)
    return 1e3 * timed_decode_steps(engine, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--shared", default="0,2048")
    parser.add_argument("--own-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    ceil = ceilings()
    cfg = LLAMA3_8B
    loaded = LoadedModel(
        random_model(cfg, torch.bfloat16),
        cfg,
        word_tokenizer(cfg.vocab_size),
        ModelSource("llama3-8b-shaped", "hf", Path(".")),
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    rows = []
    print(f"{'batch':>5} {'shared':>6} {'own-keys ms':>11} {'cascade ms':>10} {'ratio':>6} "
          f"{'floor, per row':>14} {'floor, once':>11} {'+graph MB':>14}", flush=True)  # fmt: skip
    for batch in (int(b) for b in args.batches.split(",")):
        for shared in (int(s) for s in args.shared.split(",")):
            ms, built_bytes = {}, {}
            for cascade in (False, True):
                before = torch.cuda.memory_reserved()
                engine = engine_for(
                    loaded,
                    RunnerOptions(cascade_attention=cascade, piecewise_extend_graphs=False),
                    max_num_seqs=batch,
                    kv_cache_memory_bytes=24 << 30,
                )
                built_bytes[cascade] = torch.cuda.memory_reserved() - before  # KV pool, graphs, buffers
                ms[cascade] = step_ms(engine, batch, shared, args.own_tokens, args.steps)
                del engine
                gc.collect()
                torch.cuda.empty_cache()
            context = shared + args.own_tokens + 5 + args.steps / 2  # at the middle of the window
            per_row = 1e3 * (weight_bytes + batch * context * kv_per_token) / ceil["copy_bytes_per_s"]
            once = (
                1e3 * (weight_bytes + (shared + batch * (context - shared)) * kv_per_token) / ceil["copy_bytes_per_s"]
            )
            graphs_mb = (built_bytes[True] - built_bytes[False]) / 2**20  # the shared-pass captures' share
            row = {"batch": batch, "shared": shared, "own_keys_ms": ms[False], "cascade_ms": ms[True],
                   "floor_per_row_ms": per_row, "floor_once_ms": once,
                   "engine_reserved_bytes": built_bytes, "shared_pass_graph_mb": graphs_mb}  # fmt: skip
            rows.append(row)
            print(f"{batch:5d} {shared:6d} {ms[False]:11.2f} {ms[True]:10.2f} {ms[False] / ms[True]:5.2f}x "
                  f"{per_row:14.2f} {once:11.2f} {graphs_mb:14.0f}", flush=True)  # fmt: skip
    if args.out is not None:
        meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv}
        args.out.write_text(json.dumps({"meta": meta, "ceilings": ceil, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
