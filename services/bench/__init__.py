"""`dspark-serve bench`: a load generator for any OpenAI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import platform
import sys
import time
from pathlib import Path

import httpx

from services.bench.plots import write_plots
from services.bench.progress import PROGRESS_MODES, BenchProgress
from services.bench.redact import REDACTED, Redactor
from services.bench.report import markdown_table, write_json
from services.bench.runner import RunConfig, discover_model, run_all
from services.bench.workloads import WORKLOADS, WorkloadConfig, make_workload


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return levels


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return seconds


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """What the sessions are: shared by `bench` and benchmarks/offline_sessions.py, which
    replays the same sessions through the offline engine."""
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="agentic", help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--think-time", type=float, default=0.5, help="agentic: mean seconds between turns")
    parser.add_argument("--system-prompt-words", type=int, default=600, help="agentic: shared system prompt size")
    parser.add_argument("--turns", type=_levels, default=(3, 8), help="agentic: min,max turns per session")
    parser.add_argument("--max-tokens", type=int, default=None, help="override every request's max_tokens")
    parser.add_argument("--input-len", type=int, default=256, help="random: prompt words")
    parser.add_argument("--output-len", type=int, default=128, help="random: output tokens")
    parser.add_argument("--ignore-eos", action="store_true", help="random: send ignore_eos (server extension)")


def workload_config_from_args(args: argparse.Namespace) -> WorkloadConfig:
    turns = args.turns if len(args.turns) == 2 else (args.turns[0], args.turns[0])
    return WorkloadConfig(
        system_prompt_words=args.system_prompt_words,
        turns_min=min(turns),
        turns_max=max(turns),
        think_time_s=args.think_time,
        input_len=args.input_len,
        output_len=args.output_len,
        ignore_eos=args.ignore_eos,
        max_tokens=args.max_tokens,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model id (default: the server's first model)")
    parser.add_argument(
        "--api-key", default=None, help="bearer token for the server; never written to the results or printed"
    )
    parser.add_argument("--concurrency", type=_levels, default=(1, 8, 32), help="levels, e.g. 1,8,32")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, default=None, help="seconds per concurrency level")
    bound.add_argument("--num-requests", type=int, default=None, help="requests per concurrency level")
    parser.add_argument("--output-dir", type=Path, default=Path("bench-results"), help="where JSON and PNG go")
    add_workload_arguments(parser)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sent with every request (0: greedy); default: not sent, so each server samples its own way",
    )
    parser.add_argument("--label", default=None, help="name of the server under test, kept in the JSON")
    parser.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default="auto",
        help="live progress on stderr: a bar per level, a line every --progress-interval seconds, or none; "
        "auto: a bar on a terminal, lines otherwise (default: %(default)s)",
    )
    parser.add_argument(
        "--progress-interval",
        type=_positive_seconds,
        default=10.0,
        help="seconds between progress lines (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    duration, num_requests = args.duration, args.num_requests
    if duration is None and num_requests is None:
        duration = 60.0
    workload_cfg = workload_config_from_args(args)
    redact = Redactor.for_run(args.api_key, args.url)
    try:
        model = args.model or asyncio.run(discover_model(args.url, args.api_key))
    except (httpx.HTTPError, RuntimeError) as exc:
        print(redact.text(f"bench: cannot list the models of {args.url}: {exc}"), file=sys.stderr)
        return 2
    cfg = RunConfig(
        base_url=args.url,
        model=model,
        concurrency=tuple(args.concurrency),
        duration_s=duration,
        num_requests=num_requests,
        api_key=args.api_key,
        request_timeout_s=args.request_timeout,
        temperature=args.temperature,
    )
    workload = make_workload(args.workload, workload_cfg, args.seed)
    print(
        redact.text(
            f"bench: {args.workload} against {args.url} (model {model}), concurrency {list(cfg.concurrency)}, "
            + (f"{duration:g} s per level" if duration is not None else f"{num_requests} requests per level")
        ),
        file=sys.stderr,
        flush=True,
    )
    started = time.time()
    progress = BenchProgress(args.progress, args.progress_interval)
    summaries = [
        dataclasses.replace(s, errors=redact.value(s.errors)) for s in asyncio.run(run_all(cfg, workload, progress))
    ]
    table = markdown_table(summaries)
    print(table)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = f"bench_{args.workload}"
    meta = redact.value(
        {
            "label": args.label or args.url,
            "url": args.url,
            "model": model,
            "workload": args.workload,
            "started_unix": started,
            "machine": platform.platform(),
            "python": platform.python_version(),
            "run": dataclasses.asdict(cfg) | {"api_key": REDACTED if cfg.api_key else None},
            "workload_config": dataclasses.asdict(workload_cfg),
            "command": " ".join(sys.argv),
        }
    )
    write_json(args.output_dir / f"{stem}.json", meta, summaries)
    write_plots(args.output_dir / f"{stem}.png", redact.text(f"{args.workload} — {model}"), summaries)
    (args.output_dir / f"{stem}.md").write_text(table + "\n")
    failed = sum(s.failed for s in summaries)
    if failed:
        print(f"bench: {failed} requests failed; first errors: {summaries[-1].errors}", file=sys.stderr)
    return 0
