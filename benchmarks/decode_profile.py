"""Where a decode step's time goes on one GPU, against its memory floor (random weights in a
Llama-3-8B shape; speed does not depend on weight values).

    python benchmarks/decode_profile.py [--batches 1,16] [--steps 50] [--out results.json]

Per batch: the step time over `steps` timed steps (CUDA graphs on, as served), the floor
(all weight bytes plus the KV read, over the copy bandwidth measured in the same run), then
a profile of the same steps: device-busy ms per step (union of kernel intervals) and the
idle gap between kernels, and the device time per kernel class: matmuls (with the rate at
which they stream the weights, as a share of the copy bandwidth), attention, the fused
element-wise kernels, sampling and the rest. The gap plus the matmuls' shortfall from the
copy rate is the distance to the floor.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_gpu import LLAMA3_8B, ceilings, engine_for, random_model, word_tokenizer  # noqa: E402
from gpu_busy import union_ns  # noqa: E402

from engine.core import EngineCore  # noqa: E402
from engine.loader.load import LoadedModel  # noqa: E402
from engine.loader.resolve import ModelSource  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

PROMPT_LEN = 512

# Kernel classes by name fragment; the first match wins.
KERNEL_CLASSES = (
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "sm90", "sm100", "cublas", "splitk", "xmma", "skinny_linear")),
    ("attention", ("attn", "attention", "decode_kernel", "split_kv", "flash")),
    ("fused element-wise", ("rms", "norm", "rope", "silu", "swiglu", "add", "store_kv", "kv_inject")),
    ("sampling", ("sample", "argmax", "gumbel", "softmax", "topk", "penalt")),
    ("copy / memset", ("memcpy", "memset", "copy")),
)


def kernel_class(name: str) -> str:
    lowered = name.lower()
    for label, fragments in KERNEL_CLASSES:
        if any(f in lowered for f in fragments):
            return label
    return "other"


def start_decoding(engine: EngineCore, batch: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(3, engine.model_config.vocab_size, (PROMPT_LEN,), generator=gen).tolist()
        params = SamplingParams(max_tokens=3 * steps + 40, temperature=0.0, ignore_eos=True)
        engine.add_request(f"d{i}", prompt, params)
    while any(len(r.output_ids) == 0 for r in engine.requests.values()):
        engine.step()
    for _ in range(5):
        engine.step()


def timed_steps(engine: EngineCore, steps: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def profiled_steps(engine: EngineCore, steps: int) -> tuple[list[tuple[str, int, int]], float]:
    """(kernel name, start ns, duration ns) of every device activity over `steps` steps, and the
    wall seconds per step while profiling."""
    prof = profile(activities=[ProfilerActivity.CUDA])
    torch.cuda.synchronize()
    prof.start()
    wall_s = timed_steps(engine, steps)
    prof.stop()
    results = prof.profiler.kineto_results  # type: ignore[union-attr]
    events = [
        (e.name(), e.start_ns(), e.duration_ns())
        for e in results.events()
        if e.device_type() == DeviceType.CUDA and e.duration_ns() > 0
    ]
    return events, wall_s


def profile_batch(loaded: LoadedModel, copy_bytes_per_s: float, batch: int, steps: int) -> dict[str, Any]:
    cfg = loaded.config
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    # the matmuls stream every weight but the embedding table (a decode step reads B rows of it)
    matmul_bytes = sum(
        p.numel() * p.element_size() for n, p in loaded.model.named_parameters() if "embed" not in n and p.dim() == 2
    )
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    engine = engine_for(loaded, max_num_seqs=max(batch, 1), kv_cache_memory_bytes=8 << 30)
    start_decoding(engine, batch, steps)
    step_s = timed_steps(engine, steps)
    events, profiled_step_s = profiled_steps(engine, steps)
    ctx = PROMPT_LEN + 5 + 1.5 * steps
    floor_s = (weight_bytes + batch * ctx * kv_bytes_per_token) / copy_bytes_per_s
    span_ns = max(s + d for _, s, d in events) - min(s for _, s, _ in events)
    busy_ns = union_ns([(s, s + d) for _, s, d in events])
    by_class: dict[str, int] = defaultdict(int)
    by_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, _, dur in events:
        by_class[kernel_class(name)] += dur
        by_name[name][0] += 1
        by_name[name][1] += dur
    matmul_s = by_class["matmul"] / 1e9 / steps
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "batch": batch,
        "step_ms": step_s * 1e3,
        "floor_ms": floor_s * 1e3,
        "x_floor": step_s / floor_s,
        "profiled_step_ms": profiled_step_s * 1e3,
        "device_busy_ms_per_step": busy_ns / 1e6 / steps,
        "gap_ms_per_step": (span_ns - busy_ns) / 1e6 / steps,
        "kernels_per_step": len(events) / steps,
        "ms_per_step_by_class": {k: v / 1e6 / steps for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "matmul_weight_stream_share_of_copy": (matmul_bytes / matmul_s) / copy_bytes_per_s,
        "top_kernels": [
            {"name": n[:90], "per_step": c / steps, "ms_per_step": d / 1e6 / steps}
            for n, (c, d) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:14]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    ceil = ceilings()
    print(f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    loaded = LoadedModel(
        random_model(LLAMA3_8B, torch.bfloat16),
        LLAMA3_8B,
        word_tokenizer(LLAMA3_8B.vocab_size),
        ModelSource(name="llama3-8b-shaped", kind="hf", path=Path(".")),
    )
    rows = [profile_batch(loaded, ceil["copy_bytes_per_s"], int(b), args.steps) for b in args.batches.split(",")]
    for row in rows:
        print(json.dumps(row, indent=1), flush=True)
    columns = ("batch", "ms / step", "floor ms", "x floor", "device busy ms", "gap ms", "kernels", "matmul ms")
    print("| " + " | ".join((*columns, "matmul stream / copy")) + " |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['step_ms']:.2f} | {r['floor_ms']:.2f} | {r['x_floor']:.2f} | "
            f"{r['device_busy_ms_per_step']:.2f} | {r['gap_ms_per_step']:.2f} | {r['kernels_per_step']:.0f} | "
            f"{r['ms_per_step_by_class'].get('matmul', 0.0):.2f} | {r['matmul_weight_stream_share_of_copy']:.2f} |"
        )
    if args.out is not None:
        args.out.write_text(
            json.dumps({"ceilings": ceil, "device": torch.cuda.get_device_name(), "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
