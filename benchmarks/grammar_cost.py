"""What a grammar costs in the engine (docs/design.md §2.8), side by side in one run: tokens/s of
JSON-Schema-constrained against unconstrained requests at batch 1 and 16, and a mixed batch
(half constrained, half not) against the all-unconstrained batch of the same size.

    python benchmarks/grammar_cost.py [--device cpu|cuda] [--model smollm2-135m|PATH|random-llama3-8b]
        [--dtype float32|bfloat16] [--new-tokens 128] [--batch 16] [--single-prompts 4] [--rounds 2]
        [--speculative] [--drafter DIR] [--tokenizer DIR] [--out results.json]

`--model random-llama3-8b` (CUDA only) is `benchmarks/engine_gpu.py`'s Llama-3-8B-shaped model
with random weights over SmolLM2's tokenizer and vocabulary, built in memory: a grammar needs a
real tokenizer, and speed does not depend on weight values. Any model directory or GGUF whose
tokenizer the grammar compiler can read works as well.

Every request is greedy, on a chat prompt of tests/data/prompts.py, with the same --new-tokens
limit; unconstrained requests ignore EOS so they run to it, constrained ones follow SCHEMA
(bounded fields, so they end by themselves). The prefix cache is off: every run prefills.

Why the mixed batch: a grammar request advances on a one-step lag (its next mask needs its last
token on the host), so it decodes at most every other step; the claim is that the requests
beside it lose nothing. Rates are measured over each run's steady window, from the moment
every request has its first token to the moment the first one finishes (all rows alive):
per-request tokens/s of each kind, launched steps per second, and milliseconds per step.
Runs are interleaved across configurations, --rounds times, and summed.

With --speculative (or --drafter DIR) every configuration runs again on a DSpark engine (the
model's shipped drafter by default): there a grammar row commits one token per verify step, its
drafts computed and ignored (§2.8), while the other rows keep their acceptance.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.smollm2_offline import git_commit, machine_name  # noqa: E402
from engine.config import EngineConfig, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import LoadedModel, load_model  # noqa: E402
from engine.loader.resolve import ModelSource, resolve_model, shipped_chat_template, shipped_drafter  # noqa: E402
from engine.loader.tokenizer import Tokenizer  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.structured import GrammarSpec  # noqa: E402
from tests.data.prompts import CHAT_PROMPTS  # noqa: E402

RANDOM_8B = "random-llama3-8b"

# A structured answer; every field bounded so that the constrained output ends.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 32},
        "answer": {"type": "string", "maxLength": 120},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 3, "maxItems": 3},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["topic", "answer", "keywords", "confidence"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Config:
    name: str
    batch: int
    constrained: int  # how many of the batch's rows follow SCHEMA (the first ones)
    dspark: bool = False  # on the DSpark engine (--speculative)


@dataclass
class Window:
    """Sums over steady windows (every row alive); rates are tokens per row per second."""

    seconds: float = 0.0
    launches: int = 0
    plain_tokens: int = 0
    plain_row_seconds: float = 0.0  # rows x seconds
    grammar_tokens: int = 0
    grammar_row_seconds: float = 0.0
    total_tokens: int = 0  # whole runs, prefill included
    total_seconds: float = 0.0
    grammar_lengths: list[int] = field(default_factory=list)  # tokens of each constrained output

    def add(self, other: Window) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def rates(self) -> dict[str, float | None]:
        def ratio(a: float, b: float) -> float | None:
            return a / b if b > 0 else None

        return {
            "launches_per_s": ratio(self.launches, self.seconds),
            "ms_per_launch": ratio(1e3 * self.seconds, self.launches),
            "plain_row_tokens_per_s": ratio(self.plain_tokens, self.plain_row_seconds),
            "grammar_row_tokens_per_s": ratio(self.grammar_tokens, self.grammar_row_seconds),
            "window_tokens_per_s": ratio(self.plain_tokens + self.grammar_tokens, self.seconds),
            "end_to_end_tokens_per_s": ratio(self.total_tokens, self.total_seconds),
            "grammar_mean_tokens": ratio(sum(self.grammar_lengths), len(self.grammar_lengths)),
        }


def load(model: str, device: str, dtype: torch.dtype, tokenizer_dir: Path | None) -> LoadedModel:
    if model != RANDOM_8B:
        return load_model(model, dtype=dtype, device=device, progress=False)
    if device != "cuda":
        raise SystemExit(f"--model {RANDOM_8B} is built on the GPU: pass --device cuda")
    from benchmarks.engine_gpu import LLAMA3_8B, random_model

    if tokenizer_dir is None:
        tokenizer = Tokenizer.from_source(resolve_model("smollm2-135m"))
    else:
        tokenizer = Tokenizer.from_hf_dir(tokenizer_dir, chat_template=shipped_chat_template("smollm2-135m"))
    config = dataclasses.replace(LLAMA3_8B, vocab_size=tokenizer.vocab_size, eos_token_ids=tokenizer.eos_token_ids)
    source = ModelSource(name=RANDOM_8B, kind="hf", path=Path("."))
    return LoadedModel(random_model(config, dtype), config, tokenizer, source)


def chat_ids(tokenizer: Any, conversation: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def run(engine: EngineCore, prompts: list[list[int]], constrained: int, new_tokens: int) -> Window:
    """One batch: the first `constrained` prompts under SCHEMA, the rest unconstrained."""
    grammar = GrammarSpec.json_schema(SCHEMA)
    kinds: dict[str, bool] = {}  # request id -> constrained
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        request_id = f"r{time.perf_counter_ns()}-{i}"
        kinds[request_id] = i < constrained
        if i < constrained:
            params = SamplingParams(max_tokens=new_tokens, temperature=0.0, grammar=grammar)
        else:
            params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(request_id, prompt, params)
    # (time, launches so far, {request id: new tokens}) after every step call
    events: list[tuple[float, int, dict[str, int]]] = []
    first: dict[str, int] = {}  # request id -> index of the event with its first token
    finished: dict[str, int] = {}
    lengths: dict[str, int] = {}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        events.append((time.perf_counter(), engine.steps_total, {o.request_id: len(o.new_token_ids) for o in outputs}))
        for out in outputs:
            if out.new_token_ids:
                first.setdefault(out.request_id, len(events) - 1)
            if out.finished:
                finished.setdefault(out.request_id, len(events) - 1)
                lengths[out.request_id] = len(out.token_ids)
    end = time.perf_counter()
    lo, hi = max(first.values()), min(finished.values())
    window = Window(total_tokens=sum(lengths.values()), total_seconds=end - start)
    window.grammar_lengths = [n for request_id, n in lengths.items() if kinds[request_id]]
    if hi <= lo:
        return window  # no step with every row alive (a row ended at its first token)
    window.seconds = events[hi][0] - events[lo][0]
    # a step launched by call k delivers in call k + 1: the steps delivering in (lo, hi]
    window.launches = events[hi - 1][1] - events[lo - 1][1]
    for _, _, produced in events[lo + 1 : hi + 1]:
        for request_id, n in produced.items():
            if kinds[request_id]:
                window.grammar_tokens += n
            else:
                window.plain_tokens += n
    window.grammar_row_seconds = constrained * window.seconds
    window.plain_row_seconds = (len(prompts) - constrained) * window.seconds
    return window


def engine_for(
    loaded: LoadedModel, device: str, dtype: torch.dtype, batch: int, speculative: SpeculativeConfig | None
) -> EngineCore:
    config = EngineConfig(
        model=loaded.name,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        max_num_seqs=batch,
        max_model_len=2048,
        enable_prefix_cache=False,
        kv_cache_memory_bytes=2 << 30,  # enough for every configuration; up to four engines share the device
        speculative=speculative,
    )
    return EngineCore(config, parts=build_engine_parts(config, loaded=loaded))


def configurations(big: int, dspark: bool) -> list[Config]:
    """batch 1 unconstrained, constrained; batch `big` unconstrained, constrained, mixed."""
    suffix = ", DSpark" if dspark else ""
    return [
        Config(f"batch 1, unconstrained{suffix}", 1, 0, dspark),
        Config(f"batch 1, constrained{suffix}", 1, 1, dspark),
        Config(f"batch {big}, unconstrained{suffix}", big, 0, dspark),
        Config(f"batch {big}, constrained{suffix}", big, big, dspark),
        Config(f"batch {big}, mixed {big // 2} + {big - big // 2}{suffix}", big, big // 2, dspark),
    ]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def comparisons(rows: list[dict[str, float | None]], big: int, label: str) -> dict[str, float | None]:
    """The ratios that answer the questions, from the five rows of `configurations`."""
    b1_plain, b1_grammar, big_plain, big_grammar, mixed = rows
    return {
        f"{label}batch 1: constrained / unconstrained row tokens/s": ratio(
            b1_grammar["grammar_row_tokens_per_s"], b1_plain["plain_row_tokens_per_s"]
        ),
        f"{label}batch {big}: constrained / unconstrained row tokens/s": ratio(
            big_grammar["grammar_row_tokens_per_s"], big_plain["plain_row_tokens_per_s"]
        ),
        f"{label}mixed / all unconstrained: unconstrained row tokens/s": ratio(
            mixed["plain_row_tokens_per_s"], big_plain["plain_row_tokens_per_s"]
        ),
        f"{label}mixed / all constrained: constrained row tokens/s": ratio(
            mixed["grammar_row_tokens_per_s"], big_grammar["grammar_row_tokens_per_s"]
        ),
        f"{label}mixed / all unconstrained: steps/s": ratio(mixed["launches_per_s"], big_plain["launches_per_s"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m", help=f"alias, path, or {RANDOM_8B} (CUDA)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on CPU, else bfloat16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="the large batch; the mixed one is half constrained")
    parser.add_argument("--single-prompts", type=int, default=4, help="prompts run one at a time at batch 1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--speculative", action="store_true", help="also run every configuration on a DSpark engine")
    parser.add_argument("--drafter", type=Path, help="DSpark drafter directory (default: the model's shipped one)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help=f"with {RANDOM_8B}: a directory holding SmolLM2's tokenizer.json (where the GGUF is absent)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    speculative = args.speculative or args.drafter is not None
    drafter = args.drafter or (shipped_drafter(args.model) if speculative else None)
    if speculative and drafter is None:
        raise SystemExit(f"--speculative: {args.model} ships no drafter; pass --drafter DIR")
    loaded = load(args.model, args.device, dtype, args.tokenizer)
    conversations = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(max(args.batch, args.single_prompts))]
    prompts = [chat_ids(loaded.tokenizer, c) for c in conversations]
    big = args.batch
    configs = configurations(big, dspark=False) + (configurations(big, dspark=True) if speculative else [])
    engines = {
        (batch, dspark): engine_for(
            loaded, args.device, dtype, batch, SpeculativeConfig(drafter=str(drafter)) if dspark else None
        )
        for batch in {1, big}
        for dspark in {c.dspark for c in configs}
    }

    def measure(config: Config, single_prompts: int) -> Window:
        engine = engines[config.batch, config.dspark]
        if config.batch > 1:
            return run(engine, prompts[: config.batch], config.constrained, args.new_tokens)
        total = Window()
        for prompt in prompts[:single_prompts]:
            total.add(run(engine, [prompt], config.constrained, args.new_tokens))
        return total

    for config in configs:  # warm-up: grammar compilation, first-call costs, CUDA graphs
        measure(config, 1)
    totals = {c.name: Window() for c in configs}
    per_round: dict[str, list[dict[str, float | None]]] = {c.name: [] for c in configs}
    for round_ in range(args.rounds):
        for config in configs:  # interleaved, so that a slow spell of the machine hits every configuration
            window = measure(config, args.single_prompts)
            totals[config.name].add(window)
            per_round[config.name].append(window.rates())
        print(f"round {round_ + 1} done", flush=True)
    rows = {name: total.rates() for name, total in totals.items()}
    print(
        "\n| configuration | steps/s | ms/step | unconstrained row tokens/s | constrained row tokens/s "
        "| batch tokens/s (window) | end-to-end tokens/s | constrained output tokens |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        cells = [
            row[key]
            for key in (
                "launches_per_s",
                "ms_per_launch",
                "plain_row_tokens_per_s",
                "grammar_row_tokens_per_s",
                "window_tokens_per_s",
                "end_to_end_tokens_per_s",
                "grammar_mean_tokens",
            )
        ]
        print(f"| {name} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    names = [c.name for c in configs]
    compared = comparisons([rows[n] for n in names[:5]], big, "")
    if speculative:
        compared |= comparisons([rows[n] for n in names[5:]], big, "DSpark engine, ")
        compared["batch 1: constrained row tokens/s, DSpark / plain engine"] = ratio(
            rows[names[6]]["grammar_row_tokens_per_s"], rows[names[1]]["grammar_row_tokens_per_s"]
        )
    print()
    for label, value in compared.items():
        print(f"{label}: {'-' if value is None else f'{value:.3f}'}")
    if args.out:
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "device": args.device,
            "dtype": str(dtype),
            "model": args.model,
            "machine": machine_name(args.device),
            "commit": git_commit(),
            "threads": torch.get_num_threads(),
            "new_tokens": args.new_tokens,
            "rounds": args.rounds,
            "schema": SCHEMA,
            "rows": rows,
            "per_round": per_round,
            "drafter": None if drafter is None else str(drafter),
            "comparisons": compared,
        }
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
