"""Offline generation speed with the embedded SmolLM2, side by side in one run:

- our engine, plain greedy decoding, at batch 1 and 16;
- our engine with DSpark (the shipped drafter, or --drafter) at the same batches, once per
  block size in --gammas (default: the drafter's own; a shorter block verifies fewer tokens),
  and with --spec-max-batch-size N once more with drafting off for decode steps of more than
  N requests;
- Hugging Face transformers `generate` on the same prompts and weights (the peer).

    python benchmarks/smollm2_offline.py [--device cpu|cuda] [--model smollm2-135m|PATH.gguf]
        [--dtype float32|bfloat16|auto] [--drafter DIR] [--gammas 7,4] [--spec-max-batch-size N]
        [--batches 1,16] [--new-tokens 64]
        [--min-prompts 8] [--out results.json]

--dtype defaults to float32 on CPU and bfloat16 on a GPU (with CUDA graphs); every system
runs in the same dtype. `--dtype auto` on CPU gives the engine the GGUF's own Q8_0/Q4_1 blocks
(docs/design.md §2.9) with float32 activations, and transformers the float32 dequantised file.

Every system gets the same held-out chat prompts (conversations the shipped drafter never
trained on), in the same waves of `batch` prompts (at least --min-prompts prompts per batch
size, so batch 1 averages over several conversations), and greedy decoding up to
--new-tokens tokens, stopping at EOS; tokens/s counts the tokens generated up to EOS over the
wall time of the generate calls (prefill included); the engine's "decode only" figures count
the tokens after each request's first over the time from a wave's last first token to its
end. Each system runs one wave untimed first (kernel compilation, CUDA graphs, allocator);
the engine's prefix cache is off, so the timed waves prefill again. The timed waves are
interleaved (wave 1 on every system, then wave 2...), so that a slow spell of a shared
machine does not land on one system alone.
Greedy DSpark commits the plain engine's tokens (token for token in float32, which the
lossless tests check; in bf16 a verify row may round differently from a decode row, so the
token counts are recorded too). Ratios are printed last.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.loader.resolve import resolve_model, shipped_drafter  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from tests.data.spec_prompts import spec_prompt_conversations  # noqa: E402


def prompts_for(tokenizer: Any, n: int) -> list[list[int]]:
    return [
        tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
        for c in spec_prompt_conversations(n)
    ]


def machine_name(device: str) -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo (else the platform's)."""
    if device != "cpu":
        return torch.cuda.get_device_name()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def waves_of(prompts: list[list[int]], batch: int) -> list[list[list[int]]]:
    return [prompts[i : i + batch] for i in range(0, len(prompts), batch)]


@dataclass
class WaveTiming:
    tokens: int  # generated, up to and including EOS
    seconds: float  # the whole generate call, prefill included
    decode_tokens: int = 0  # tokens after each request's first (engine only)
    decode_seconds: float = 0.0  # from the wave's last first token to its end (engine only)

    def __add__(self, other: WaveTiming) -> WaveTiming:
        return WaveTiming(
            self.tokens + other.tokens,
            self.seconds + other.seconds,
            self.decode_tokens + other.decode_tokens,
            self.decode_seconds + other.decode_seconds,
        )


def run_engine(engine: EngineCore, prompts: list[list[int]], new_tokens: int) -> WaveTiming:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}-{time.perf_counter_ns()}", p, params)
    produced, first_token_s = 0, start
    while engine.has_unfinished_requests():
        for out in engine.step():
            produced += len(out.new_token_ids)
            if out.timings is not None and out.timings.first_token_s is not None:
                first_token_s = max(first_token_s, out.timings.first_token_s)
    end = time.perf_counter()
    return WaveTiming(produced, end - start, produced - len(prompts), end - first_token_s)


def generated_until_eos(rows: torch.Tensor, eos: set[int]) -> int:
    """Tokens of each row of `rows` [B, N] up to and including its first EOS."""
    total = 0
    for row in rows.tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
        total += stop + 1
    return total


def load_hf(model_name: str, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    source = resolve_model(model_name)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(source.path.parent), gguf_file=source.path.name, torch_dtype=dtype
    )
    return model.to(device).eval()


def run_hf(model: Any, prompts: list[list[int]], new_tokens: int, device: str, eos: set[int]) -> WaveTiming:
    """One left-padded `generate` call."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=0,
        )
        elapsed = time.perf_counter() - start
    return WaveTiming(generated_until_eos(out[:, width:], eos), elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m", help="alias or GGUF path of SmolLM2-135M-Instruct")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "auto"), help="default: float32 on CPU, else bfloat16"
    )
    parser.add_argument("--drafter", type=Path, help="drafter directory (default: the shipped one)")
    parser.add_argument("--gammas", default="", help="DSpark block sizes, e.g. 7,4 (default: the drafter's)")
    parser.add_argument(
        "--spec-max-batch-size",
        type=int,
        help="also run DSpark (the drafter's block size) with SpeculativeConfig.max_batch_size set to this",
    )
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--min-prompts",
        type=int,
        default=8,
        help="each batch size runs ceil(N / batch) waves of prompts (batch 1: N one at a time)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    quantized = args.dtype == "auto" and args.device == "cpu"  # the engine's `auto`: the file's blocks
    dense_dtype = "float32" if args.device == "cpu" else "bfloat16"
    dtype = getattr(torch, dense_dtype if args.dtype in (None, "auto") else args.dtype)
    loaded = load_model(args.model, dtype=dtype, device=args.device, progress=False, quantized=quantized)
    drafter = args.drafter or shipped_drafter("smollm2-135m")
    gammas: list[int | None] = [int(g) for g in args.gammas.split(",")] if args.gammas else [None]
    dspark_names = [] if drafter is None else ["engine_dspark" if g is None else f"engine_dspark_g{g}" for g in gammas]
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": args.device,
        "dtype": str(dtype),
        "weights": "gguf blocks" if quantized else "dense",
        "machine": machine_name(args.device),
        "commit": git_commit(),
        "threads": torch.get_num_threads(),
        "drafter": str(drafter),
        "new_tokens": args.new_tokens,
        "rows": [],
    }
    variants: dict[str, SpeculativeConfig | None] = {"engine": None}
    for name, gamma in zip(dspark_names, gammas, strict=True):
        variants[name] = SpeculativeConfig(drafter=str(drafter), gamma=gamma)
    if drafter is not None and args.spec_max_batch_size is not None:
        name = f"engine_dspark_cap{args.spec_max_batch_size}"
        dspark_names.append(name)
        variants[name] = SpeculativeConfig(drafter=str(drafter), max_batch_size=args.spec_max_batch_size)
    hf_model = None if args.skip_hf else load_hf(args.model, args.device, dtype)
    eos = set(loaded.config.eos_token_ids) | set(loaded.tokenizer.eos_token_ids)
    for batch in (int(b) for b in args.batches.split(",")):
        # every system runs the same waves of `batch` prompts, one wave after the other
        waves = waves_of(prompts_for(loaded.tokenizer, -(-args.min_prompts // batch) * batch), batch)
        row: dict[str, Any] = {"batch": batch, "prompts": sum(len(w) for w in waves)}
        systems: dict[str, Callable[[list[list[int]]], WaveTiming]] = {}
        engines: dict[str, EngineCore] = {}
        for name, spec in variants.items():
            config = EngineConfig(
                model=args.model,
                device=args.device,
                dtype="auto" if quantized else str(dtype).removeprefix("torch."),
                max_num_seqs=max(batch, 1),
                max_model_len=2048,
                enable_prefix_cache=False,
                speculative=spec,
            )
            engines[name] = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
            systems[name] = partial(run_engine, engines[name], new_tokens=args.new_tokens)
        if hf_model is not None:
            systems["transformers"] = partial(run_hf, hf_model, new_tokens=args.new_tokens, device=args.device, eos=eos)
        for run in systems.values():
            run(waves[0])  # warm-up pass
        before = {name: engine.stats() for name, engine in engines.items()}
        # Interleaved: each wave runs on every system in turn, so that a slow spell of a shared
        # machine falls on all of them rather than on one.
        totals = {name: WaveTiming(0, 0.0) for name in systems}
        for wave in waves:
            for name, run in systems.items():
                totals[name] += run(wave)
        for name, total in totals.items():
            row[name] = total.tokens / total.seconds
            row[f"{name}_tokens"] = total.tokens
            if total.decode_seconds > 0:
                row[f"{name}_decode"] = total.decode_tokens / total.decode_seconds
        for name, engine in engines.items():
            if variants[name] is None:
                continue
            after = engine.stats()
            verifies = after.spec_verify_steps_total - before[name].spec_verify_steps_total
            accepted = after.spec_accepted_tokens_total - before[name].spec_accepted_tokens_total
            # tokens per verify; 0 when every step of the run decoded without drafting
            row[f"{name}_accept_len"] = (accepted + verifies) / verifies if verifies else 0.0
            row[f"{name}_vs_engine"] = row[name] / row["engine"]
            row[f"{name}_decode_vs_engine"] = row[f"{name}_decode"] / row["engine_decode"]
        if hf_model is not None:
            row["engine_vs_transformers"] = row["engine"] / row["transformers"]
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| batch | engine tok/s (decode only) | transformers tok/s | engine / transformers | "
        + " | ".join(
            f"{n.removeprefix('engine_')} tok/s (accept) | {n.removeprefix('engine_')} / engine (decode only)"
            for n in dspark_names
        )
        + " |"
    )
    print("|---" * (4 + 2 * len(dspark_names)) + "|")
    for r in results["rows"]:
        cells: list[object] = [
            f"{r['engine']:.2f} ({r['engine_decode']:.2f})",
            r.get("transformers"),
            r.get("engine_vs_transformers"),
        ]
        cells.insert(0, r["batch"])
        for n in dspark_names:
            cells += [
                f"{r[n]:.2f} ({r[f'{n}_accept_len']:.2f})",
                f"{r[f'{n}_vs_engine']:.2f} ({r[f'{n}_decode_vs_engine']:.2f})",
            ]
        print(
            "| "
            + " | ".join("-" if c is None else (f"{c:.2f}" if isinstance(c, float) else str(c)) for c in cells)
            + " |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
