"""The pure parts of benchmarks/cpu_vs_llamacpp.py: its command line, the prompt ids, the
sums of a system's runs, the ratios and bars of issue 19's "What it must show", greedy-token
agreement, implied weight-stream bandwidth, and the tables and plot. No torch, no llama.cpp:
tests/test_cpu_vs_llamacpp.py exercises these without either peer."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

DEFAULT_LLAMACPP_PYTHON = Path(".bench/llamacpp-venv/bin/python")

# System names, as they appear in the JSON. Batch 1 unless the name says batch (--batch).
ENGINE_FP32 = "engine_fp32"
ENGINE_BF16 = "engine_bf16"
ENGINE_NATIVE = "engine_native"
LLAMACPP_Q = "llamacpp_gguf"  # llama.cpp on the GGUF file as shipped (Q4_1 for the embedded model)
LLAMACPP_F32 = "llamacpp_f32"  # llama.cpp on its own f32 conversion of that file
ENGINE_FP32_BATCH = "engine_fp32_batch"
ENGINE_NATIVE_BATCH = "engine_native_batch"
TRANSFORMERS_BATCH = "transformers_batch"


@dataclass(frozen=True)
class Bar:
    """One line of "What it must show": numerator / denominator of tokens/s >= at_least.
    Batch 1 compares decode-only tokens/s (first token to last); the batch rows compare
    tokens/s with prefill included, as benchmarks/smollm2_offline.py does (its transformers
    runner has no first-token time)."""

    label: str
    numerator: str
    denominator: str
    at_least: float
    decode_only: bool = True


BARS = (
    Bar("batch 1 fp32: engine / llama.cpp f32 (decode)", ENGINE_FP32, LLAMACPP_F32, 1.0),
    Bar("batch 1 native: engine / llama.cpp on the GGUF (decode)", ENGINE_NATIVE, LLAMACPP_Q, 0.8),
    Bar("batch --batch fp32: engine / transformers (prefill incl.)", ENGINE_FP32_BATCH, TRANSFORMERS_BATCH, 3.0, False),
    Bar(
        "batch --batch native (the GGUF default): engine / transformers (prefill incl.)",
        ENGINE_NATIVE_BATCH,
        TRANSFORMERS_BATCH,
        3.0,
        False,
    ),
)
# Greedy tokens compared: (system, reference).
AGREEMENT_PAIRS = (
    (ENGINE_FP32, LLAMACPP_F32),
    (ENGINE_NATIVE, LLAMACPP_Q),
    (ENGINE_NATIVE, ENGINE_FP32),
    (ENGINE_BF16, ENGINE_FP32),
    (LLAMACPP_Q, LLAMACPP_F32),
)


def build_parser(description: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="alias or GGUF path (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=6, help="chat prompts decoded one at a time per round")
    parser.add_argument("--new-tokens", type=int, default=96, help="tokens generated per prompt")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; every system runs once per round")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="every system's threads")
    parser.add_argument(
        "--engine-dtypes",
        default="float32,bfloat16",
        help="engine rows besides the native one, at batch 1 and at --batch (float32 is always run)",
    )
    parser.add_argument(
        "--native-dtype", default="auto", help="the engine's dtype for the GGUF's own format (default: %(default)s)"
    )
    parser.add_argument("--batch", type=int, default=16, help="the engine-vs-transformers batch (0: skip)")
    parser.add_argument("--llamacpp-python", type=Path, default=DEFAULT_LLAMACPP_PYTHON)
    parser.add_argument(
        "--llamacpp-no-repack", action="store_true", help="llama.cpp loads without its extra buffer types"
    )
    parser.add_argument("--f32-gguf", type=Path, help="llama.cpp's f32 file (default: .bench/<model>.f32.gguf)")
    parser.add_argument("--copy-mib", type=int, default=512, help="buffer of the memory read and copy measurements")
    parser.add_argument("--skip-rss", action="store_true", help="do not measure the engine processes' RSS")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="PNG (default: the --json path with .png)")
    return parser


def parse_args(argv: Sequence[str] | None = None, description: str = "") -> argparse.Namespace:
    parser = build_parser(description)
    args = parser.parse_args(argv)
    for name in ("prompts", "new_tokens", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch < 0:
        parser.error("--batch must be >= 0")
    args.engine_dtypes = engine_dtypes(args.engine_dtypes)
    if args.plot is None and args.json is not None:
        args.plot = args.json.with_suffix(".png")
    return args


def engine_row_name(dtype: str) -> str:
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    return f"engine_{short.get(dtype, dtype)}"


def engine_dtypes(text: str) -> tuple[str, ...]:
    """'bfloat16' -> ('float32', 'bfloat16'): float32 first and always, no repeats."""
    names = ["float32"] + [d.strip() for d in text.split(",") if d.strip()]
    return tuple(dict.fromkeys(names))


class ChatTokenizer(Protocol):
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str: ...
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


def prompt_ids(tokenizer: ChatTokenizer, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[int]]:
    """Each conversation rendered by the model's chat template (with the assistant's opening)
    and encoded by our tokenizer; the rendered text holds its special tokens already."""
    return [
        tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
        for c in conversations
    ]


@dataclass(frozen=True)
class Timing:
    """Generated tokens and wall time. `seconds` runs from the prompt's submission to the last
    token (prefill included); `decode_seconds` from the first token to the last, over
    `decode_tokens` = tokens - 1 per prompt (a batch: from its last first token)."""

    tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    def __add__(self, other: Timing) -> Timing:
        return Timing(
            self.tokens + other.tokens,
            self.seconds + other.seconds,
            self.decode_tokens + other.decode_tokens,
            self.decode_seconds + other.decode_seconds,
        )

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass(frozen=True)
class Agreement:
    system: str
    reference: str
    matching: int  # tokens before each prompt's first difference, summed
    total: int  # tokens compared (the shorter of each pair)
    identical_prompts: int
    prompts: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def agreement(system: str, reference: str, tokens: Mapping[str, Sequence[Sequence[int]]]) -> Agreement | None:
    """How far `system`'s greedy tokens follow `reference`'s, prompt by prompt; None unless both ran."""
    if system not in tokens or reference not in tokens:
        return None
    pairs = list(zip(tokens[system], tokens[reference], strict=True))
    matching = [common_prefix(a, b) for a, b in pairs]
    total = [min(len(a), len(b)) for a, b in pairs]
    return Agreement(
        system,
        reference,
        sum(matching),
        sum(total),
        sum(m == t for m, t in zip(matching, total, strict=True)),
        len(pairs),
    )


@dataclass(frozen=True)
class BarResult:
    bar: Bar
    ratio: float | None  # None: a side did not run

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "not run"
        return "meets" if self.ratio >= self.bar.at_least else "below"


def bar_results(timings: Mapping[str, Timing]) -> list[BarResult]:
    def speed(name: str, decode_only: bool) -> float:
        timing = timings.get(name)
        if timing is None:
            return 0.0
        return timing.decode_tokens_per_s if decode_only else timing.tokens_per_s

    results = []
    for bar in BARS:
        num, den = speed(bar.numerator, bar.decode_only), speed(bar.denominator, bar.decode_only)
        results.append(BarResult(bar, num / den if num > 0 and den > 0 else None))
    return results


def stream_gbs(weight_bytes: int, decode_tokens_per_s: float) -> float:
    """GB/s (1e9) of weights read at batch 1 if each token streams all `weight_bytes` once."""
    return weight_bytes * decode_tokens_per_s / 1e9


@dataclass(frozen=True)
class SystemRow:
    name: str
    label: str  # what it runs, e.g. "llama.cpp 0.3.36, Q4_1 file"
    batch: int
    timing: Timing
    weight_bytes: int | None  # weights streamed per batch-1 step; None where not meaningful


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def systems_table(rows: Sequence[SystemRow], read_gbs: float) -> str:
    lines = [
        "| system | what | batch | tok/s (decode only) | weights MB/token "
        "| weight stream GB/s (share of a plain read) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        stream = "-"
        if r.batch == 1 and r.weight_bytes:
            gbs = stream_gbs(r.weight_bytes, r.timing.decode_tokens_per_s)
            stream = f"{gbs:.1f} ({100 * gbs / read_gbs:.0f}%)" if read_gbs > 0 else f"{gbs:.1f}"
        weights_mb = None if r.weight_bytes is None else r.weight_bytes / 1e6
        decode = f"{r.timing.decode_tokens_per_s:.2f}" if r.timing.decode_seconds > 0 else "-"
        speed = f"{r.timing.tokens_per_s:.2f} ({decode})"
        cells = [r.name, r.label, r.batch, speed, weights_mb, stream]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def bars_table(results: Sequence[BarResult]) -> str:
    lines = ["| bar (tok/s) | ratio | at least | verdict |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.bar.label} | {_cell(r.ratio)} | {r.bar.at_least:g} | {r.verdict} |")
    return "\n".join(lines)


def agreement_table(results: Sequence[Agreement]) -> str:
    lines = ["| system | reference | matching tokens | identical prompts |", "|---|---|---|---|"]
    for a in results:
        lines.append(f"| {a.system} | {a.reference} | {a.matching}/{a.total} | {a.identical_prompts}/{a.prompts} |")
    return "\n".join(lines)


def write_plot(path: Path, title: str, rows: Sequence[SystemRow], read_gbs: float) -> None:
    """Two panels: decode tokens/s per system (batch 1 and the batch rows), and each batch-1
    system's implied weight stream against the machine's plain read rate."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5))
    speed_ax, stream_ax = fig.subplots(1, 2)
    names = [r.name for r in rows]
    speed_ax.barh(names, [r.timing.decode_tokens_per_s for r in rows], color="tab:blue", label="decode only")
    speed_ax.barh(names, [r.timing.tokens_per_s for r in rows], color="tab:orange", alpha=0.6, label="prefill incl.")
    speed_ax.set_xlabel("tokens/s")
    speed_ax.set_title("generation speed")
    speed_ax.legend(fontsize=8)
    streamed = [r for r in rows if r.batch == 1 and r.weight_bytes]
    stream_ax.barh(
        [r.name for r in streamed],
        [stream_gbs(r.weight_bytes or 0, r.timing.decode_tokens_per_s) for r in streamed],
        color="tab:green",
    )
    if read_gbs > 0:
        stream_ax.axvline(read_gbs, color="tab:red", linestyle="--", label=f"plain read {read_gbs:.1f} GB/s")
        stream_ax.legend(fontsize=8)
    stream_ax.set_xlabel("GB/s of weights at batch 1")
    stream_ax.set_title("implied weight stream")
    for ax in (speed_ax, stream_ax):
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
