"""Agentic serving load on the offline engine: mixed against alternating scheduling in one run.

    python benchmarks/agentic_engine.py [--device cpu|cuda] [--model smollm2-135m|PATH|random-llama3-8b|random-tiny]
        [--sessions 8,16] [--shared-prefix 256] [--turns 3] [--turn-tokens 32,96]
        [--output-tokens 16,48] [--seed 0] [--scheduling both|mixed|alternating]
        [--expansion host|device|both] [--extend-graphs on|off|both] [--cascade on|off|both] [--gc-freeze on|off|both]
        [--profile-steps 100] [--host-profile DIR]
        [--max-num-batched-tokens 256] [--kv-cache-bytes N] [--page-size N] [--out results.json]

The workload (seeded, identical for both policies): `sessions` concurrent sessions share a
system prompt of `shared-prefix` token ids; each runs `turns` turns in a closed loop. A turn
sends the session's whole history (system prompt, earlier turns, earlier outputs) plus a
new user message of U ~ uniform(turn-tokens) ids and decodes exactly O ~ uniform(
output-tokens) tokens (greedy, EOS ignored); when it finishes, the session's next turn is
submitted at once. All sessions start together (the cold burst: their shared prefix is not
cached yet). Token ids are drawn from the vocabulary's lower half, so any model serves.

Per policy: output tokens/s over the run's wall time, TTFT mean/p50/p90 (submission to
first token), TPOT mean/p99 (per request: (finish - first token) / (O - 1)), engine steps,
mixed steps, prefill tokens computed, host ms per step (time inside EngineCore.step; on a
GPU the device runs in parallel, on CPU the host does the work). One untimed warm-up turn
runs first on each engine. Timed policies alternate per concurrency level.

On a GPU, `profile-steps` steady steps are measured: from the first step after as many
requests finished as there are sessions (the cold burst is over, turns overlap). The profiler
slows the host's launches, so it never runs in the timed pass: the workload is deterministic
(seeded, greedy), so a second pass on a fresh engine profiles the same steps
(benchmarks/gpu_busy.py) for the device ms per step, and the GPU-busy share is that over the
timed pass's wall ms per step across the same window. Mean token mix per step: decode rows
(output tokens less first tokens) and prefill tokens computed.

The cold burst: TTFT p90 over every session's first turn (all submitted together, the
shared prefix not cached yet), against the time its distinct tokens (the shared prefix once,
plus each first turn's own tokens) take at the engine's prefill rate, measured on the same
engine before the run with one fresh prompt of four step budgets (capped by the context).

`--expansion both` adds the prefill slot expansion's A/B: `host-sized` passes the size the
host knows to `repeat_interleave`, `device-sized` lets PyTorch read it back from the device
(a host sync per prefill step, engine/runner/options.py). `--extend-graphs both` adds the
A/B of prefill and mixed forwards replayed as piecewise CUDA graphs (`graphs`, the default)
against launched kernel by kernel (`eager`; engine/runner/piecewise_graphs.py).
`--cascade both` adds the A/B of shared prefixes attended once (`cascade`, the default: one
shared pass over the keys the sessions' system prompt holds once, docs/design.md §4.9)
against each request reading its whole context (`own-keys`); the result counts the steps
whose forward used the shared pass.

`--host-profile DIR` (with steady steps) runs each variant a third time with Python's
cProfile on over the same window and writes the functions the host spent it in, by own time
and by cumulative time, to DIR/host_<sessions>_<scheduling>.txt: where a step's host time
goes, apart from the wait for the device (the step's one sync shows as its own line).
On a CPU, `--host-profile` alone profiles the same window (no device profile): with
`--model random-tiny` (a Llama of a few million random weights) and `--page-size 16` (the
GPU's pages) the model costs next to nothing, so the profile shows the scheduler's and the
output path's work at a GPU run's session counts.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import itertools
import json
import platform
import pstats
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.agentic_results import (  # noqa: E402
    PolicyResult,
    SteadyWindow,
    report_line,
    with_floor,
    with_window,
)
from benchmarks.agentic_run import LaunchTimedEngine, prefill_rate, run_policy  # noqa: E402
from benchmarks.agentic_workload import Workload  # noqa: E402
from benchmarks.gc_pauses import GcPauses  # noqa: E402
from benchmarks.triton_compiles import TritonCompiles  # noqa: E402
from engine.config import (
    EngineConfig,  # noqa: E402
)
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import LoadedModel, load_model  # noqa: E402
from engine.loader.resolve import ModelSource  # noqa: E402
from engine.runner.options import RunnerOptions  # noqa: E402
from services.heap import freeze_long_lived, thaw  # noqa: E402

RANDOM_8B = "random-llama3-8b"
# Llama-shaped, a few million weights, random: the model costs next to nothing, so a CPU run
# at hundreds of sessions shows the host's work per step (with --host-profile)
RANDOM_TINY = "random-tiny"


@dataclass(frozen=True)
class Variant:
    scheduling: str
    expansion: str  # host-sized | device-sized
    extend_graphs: bool
    cascade: bool
    gc_freeze: bool  # the start-up heap frozen before the run, as a serving worker does (services/heap.py)


def build_engine(
    loaded: LoadedModel,
    args: argparse.Namespace,
    variant: Variant,
    max_num_seqs: int,
) -> LaunchTimedEngine:
    config = EngineConfig(
        model=str(loaded.source.name),
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_bytes,
        scheduling=variant.scheduling,  # type: ignore[arg-type]
        page_size=args.page_size,
    )
    options = RunnerOptions(
        host_sized_expansion=variant.expansion == "host-sized",
        piecewise_extend_graphs=variant.extend_graphs,
        cascade_attention=variant.cascade,
    )
    return LaunchTimedEngine(config, parts=build_engine_parts(config, loaded=loaded, runner_options=options))


def _pair(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(","))
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--model", default="smollm2-135m", help=f"alias, path, {RANDOM_8B} (CUDA) or {RANDOM_TINY} (any device)"
    )
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on a GPU")
    parser.add_argument("--sessions", default="8,16", help="concurrency levels, comma-separated")
    parser.add_argument("--shared-prefix", type=int, default=256)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=_pair, default=(32, 96))
    parser.add_argument("--output-tokens", type=_pair, default=(16, 48))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scheduling", choices=["both", "mixed", "alternating"], default="both")
    parser.add_argument("--expansion", choices=["host", "device", "both"], default="host")
    parser.add_argument(
        "--extend-graphs", choices=["on", "off", "both"], default="on", help="piecewise graphs of prefill/mixed steps"
    )
    parser.add_argument("--cascade", choices=["on", "off", "both"], default="on", help="shared prefixes read once")
    parser.add_argument(
        "--gc-freeze",
        choices=["on", "off", "both"],
        default="on",
        help="freeze the start-up heap out of the garbage collector's passes, as a serving worker does",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=100,
        help="steady steps profiled (on a GPU; on a CPU with --host-profile only); 0: none",
    )
    parser.add_argument("--host-profile", type=Path, default=None, help="folder for cProfile of the steady steps")
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-bytes", type=int, default=1 << 30)
    parser.add_argument("--page-size", type=int, default=0, help="KV page size; 0: the device's default")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    loaded = _load(args.model, dtype, args.device)
    policies = ["alternating", "mixed"] if args.scheduling == "both" else [args.scheduling]
    expansions = ["host-sized", "device-sized"] if args.expansion == "both" else [f"{args.expansion}-sized"]
    graph_choices = [False, True] if args.extend_graphs == "both" else [args.extend_graphs == "on"]
    cascade_choices = [False, True] if args.cascade == "both" else [args.cascade == "on"]
    freeze_choices = [False, True] if args.gc_freeze == "both" else [args.gc_freeze == "on"]
    if not args.device.startswith("cuda"):
        graph_choices = [False]  # graphs are captured on a GPU only
        cascade_choices = [False]  # the shared pass is the Triton backend's
    on_gpu = args.device.startswith("cuda")
    profile_steps = args.profile_steps if on_gpu or args.host_profile is not None else 0
    rates: dict[str, float] = {}
    if profile_steps and on_gpu:
        from benchmarks.engine_gpu import ceilings

        rates = ceilings()
    results: list[dict[str, Any]] = []
    for sessions in (int(s) for s in args.sessions.split(",")):
        load = Workload(sessions, args.shared_prefix, args.turns, args.turn_tokens, args.output_tokens, args.seed)
        for choice in itertools.product(policies, expansions, graph_choices, cascade_choices, freeze_choices):
            variant = Variant(*choice)
            result, timed = _fresh_run(loaded, args, load, variant, profile_steps, profile=False)
            profiled = None
            if timed is not None and on_gpu:  # the same steps again, under the device profiler
                _, profiled = _fresh_run(loaded, args, load, variant, profile_steps, profile=True)
            if timed is not None and args.host_profile is not None:
                host_profile = cProfile.Profile()
                _fresh_run(loaded, args, load, variant, profile_steps, profile=False, host_profiler=host_profile)
                _write_host_profile(host_profile, args.host_profile / f"host_{sessions}_{variant.scheduling}.txt")
            result = dataclasses.replace(
                with_window(result, timed, profiled),
                extend_graphs=variant.extend_graphs,
                cascade=variant.cascade,
                gc_freeze=variant.gc_freeze,
            )
            result = with_floor(result, profiled, load, loaded.config, rates)
            results.append(asdict(result))
            print(report_line(result), flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.platform(),
        "processor": platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "argv": sys.argv,
        "rates": rates,
    }
    if args.out is not None:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


def _fresh_run(
    loaded: LoadedModel,
    args: argparse.Namespace,
    load: Workload,
    variant: Variant,
    window_steps: int,
    profile: bool,
    host_profiler: cProfile.Profile | None = None,
) -> tuple[PolicyResult, SteadyWindow | None]:
    """The workload on a new engine (empty prefix cache) after a warm-up."""
    policy = variant.scheduling
    engine = build_engine(loaded, args, variant, max_num_seqs=load.sessions)
    # the warm-up's shapes are the run's (prefix, turn and output lengths), so that kernels
    # compiled or tuned per shape are ready before the clock starts
    warm = Workload(min(4, load.sessions), load.shared_prefix, 1, load.turn_tokens, load.output_tokens, load.seed + 1)
    run_policy(engine, warm, policy)
    rate = prefill_rate(engine, min(4 * args.max_num_batched_tokens, args.max_model_len - 1))
    if variant.gc_freeze:
        freeze_long_lived("benchmark")
    with GcPauses() as pauses, TritonCompiles() as compiles:
        result, steady = run_policy(engine, load, policy, variant.expansion, window_steps, profile, host_profiler)
    result = dataclasses.replace(
        result,
        prefill_tokens_per_s=rate,
        cold_floor_ms=1e3 * result.cold_distinct_tokens / rate,
        gc_full_collections=pauses.full_collections,
        gc_full_max_ms=pauses.full_max_ms,
        gc_total_ms=pauses.total_ms,
        triton_misses=compiles.misses if compiles.available else None,
        triton_miss_ms=compiles.total_ms,
        triton_miss_max_ms=compiles.max_ms,
        triton_miss_kernels=tuple(compiles.kernels.most_common()),
    )
    thaw()  # the engine's objects can go with it
    del engine  # its KV pool goes before the next engine allocates one
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result, steady


def _write_host_profile(profiler: cProfile.Profile, path: Path, top: int = 45) -> None:
    """The window's host functions, by own time then by cumulative time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order).print_stats(top)


def _load(model: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """A model by alias or path, or a random one with a word tokenizer (speed does not depend
    on weight values): RANDOM_8B, engine_gpu's Llama-3-8B shape, built on the GPU; RANDOM_TINY,
    that shape shrunk to a few million weights, on any device."""
    if model not in (RANDOM_8B, RANDOM_TINY):
        return load_model(model, dtype=dtype, device=device, progress=False)
    from benchmarks.engine_gpu import LLAMA3_8B, random_model, word_tokenizer

    if model == RANDOM_8B and device != "cuda":
        raise SystemExit(f"--model {RANDOM_8B} is built on the GPU: pass --device cuda")
    config = LLAMA3_8B
    if model == RANDOM_TINY:
        config = dataclasses.replace(
            LLAMA3_8B, vocab_size=32768, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16,
        )  # fmt: skip
    source = ModelSource(name=model, kind="hf", path=Path("."))
    return LoadedModel(random_model(config, dtype, device), config, word_tokenizer(config.vocab_size), source)


if __name__ == "__main__":
    main()
