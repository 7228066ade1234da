"""Where the batch bar's wave goes on the CPU: the engine's batch of `--batch` chat prompts
(benchmarks/cpu_vs_llamacpp.py's batch wave: greedy, `--new-tokens` each, stopping at EOS),
timed step by step after two warm waves.

    python benchmarks/cpu_batch_wave.py [--dtype float32] [--batch 16] [--new-tokens 96]

Prints the two warm waves' tok/s (prefill included, and decode only), then per number of
requests still running: the steps at that count and their median ms (the first step, the
whole wave's prefill, apart), and last the functions that took the most time of one more
wave under cProfile, so a decode step's time splits into the decoder stack's one C call, the
LM head, sampling and the host's Python.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import cpu_peer_report as report  # noqa: E402
from benchmarks.cpu_vs_llamacpp import engine_for  # noqa: E402
from benchmarks.smollm2_offline import run_engine  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from tests.data.prompts import CHAT_PROMPTS  # noqa: E402


def timed_steps(engine: EngineCore, wave: list[list[int]], new_tokens: int) -> None:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    for i, prompt in enumerate(wave):
        engine.add_request(f"wave-{i}", prompt, params)
    by_running: dict[int, list[float]] = collections.defaultdict(list)
    prefill_ms = 0.0
    while engine.has_unfinished_requests():
        running = sum(1 for req in engine.requests.values() if not req.is_finished)
        start = time.perf_counter()
        engine.step()
        elapsed_ms = 1000 * (time.perf_counter() - start)
        if prefill_ms == 0.0:
            prefill_ms = elapsed_ms
        else:
            by_running[running].append(elapsed_ms)
    print(f"first step (the wave's prefill): {prefill_ms:.1f} ms")
    print("| requests running | steps | median ms |\n|---:|---:|---:|")
    for running in sorted(by_running, reverse=True):
        steps = by_running[running]
        print(f"| {running} | {len(steps)} | {statistics.median(steps):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto (the GGUF's blocks)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=96)
    args = parser.parse_args()
    loaded = load_model(args.model, dtype=torch.float32, device="cpu", progress=False)
    wave = report.prompt_ids(loaded.tokenizer, (CHAT_PROMPTS * args.batch)[: args.batch])
    engine = engine_for(args.model, args.dtype, args.batch, loaded if args.dtype == "float32" else None)
    lengths = [len(prompt) for prompt in wave]
    print(f"{args.batch} prompts of {min(lengths)}-{max(lengths)} tokens, {torch.get_num_threads()} threads")
    for _ in range(2):
        t = run_engine(engine, wave, args.new_tokens)
        decode_rate = t.decode_tokens / t.decode_seconds
        print(f"wave: {t.tokens} tokens, {t.tokens / t.seconds:.1f} tok/s ({decode_rate:.1f} decode only)")
    timed_steps(engine, wave, args.new_tokens)
    profile = cProfile.Profile()
    profile.runcall(run_engine, engine, wave, args.new_tokens)
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
