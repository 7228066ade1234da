"""Summaries of a benchmark run: percentiles, a Markdown table and JSON (plots: services.bench.plots)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.bench.client import RequestResult

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Distribution:
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    count: int

    @staticmethod
    def of(values: Sequence[float]) -> Distribution:
        mean = sum(values) / len(values) if values else math.nan
        p50, p90, p95, p99 = (percentile(values, q) for q in PERCENTILES)
        return Distribution(mean, p50, p90, p95, p99, len(values))


@dataclass(frozen=True)
class LevelSummary:
    concurrency: int
    duration_s: float
    completed: int
    failed: int
    qps: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    errors: tuple[str, ...]


def summarize(concurrency: int, results: Sequence[RequestResult], duration_s: float) -> LevelSummary:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    duration = max(duration_s, 1e-9)
    errors = tuple(sorted({r.error or "" for r in results if not r.ok}))[:5]
    return LevelSummary(
        concurrency=concurrency,
        duration_s=duration_s,
        completed=len(ok),
        failed=len(results) - len(ok),
        qps=len(ok) / duration,
        output_tokens_per_s=output_tokens / duration,
        total_tokens_per_s=(output_tokens + prompt_tokens) / duration,
        ttft_s=Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=Distribution.of([t for r in ok if (t := r.tpot_s) is not None]),
        itl_s=Distribution.of([x for r in ok for x in r.itl_s]),
        e2e_s=Distribution.of([r.e2e_s for r in ok]),
        errors=errors,
    )


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.1f}"


def markdown_table(summaries: Sequence[LevelSummary]) -> str:
    head = (
        "| conc | reqs | fail | QPS | out tok/s | total tok/s | TTFT mean/p50/p90/p95/p99 (ms) "
        "| TPOT mean/p50/p90/p95/p99 (ms) | ITL mean/p50/p90/p95/p99 (ms) | E2E mean/p50/p90/p95/p99 (ms) |"
    )
    rows = [head, "|" + "---|" * 10]
    for s in summaries:
        dists = []
        for d in (s.ttft_s, s.tpot_s, s.itl_s, s.e2e_s):
            dists.append(" / ".join(_ms(v) for v in (d.mean, d.p50, d.p90, d.p95, d.p99)))
        rows.append(
            f"| {s.concurrency} | {s.completed} | {s.failed} | {s.qps:.2f} | {s.output_tokens_per_s:.1f} "
            f"| {s.total_tokens_per_s:.1f} | {' | '.join(dists)} |"
        )
    return "\n".join(rows)


def write_json(path: Path, meta: dict[str, Any], summaries: Sequence[LevelSummary]) -> None:
    path.write_text(
        json.dumps(
            {"meta": meta, "levels": [asdict(s) for s in summaries]},
            indent=2,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else x,
        )
    )


def read_json(path: Path) -> tuple[dict[str, Any], list[LevelSummary]]:
    """The inverse of `write_json`: a run's meta and its per-level summaries."""
    data = json.loads(path.read_text())

    def dist(raw: dict[str, Any]) -> Distribution:
        def value(key: str) -> float:  # write_json may have stored NaN as null
            return math.nan if raw[key] is None else float(raw[key])

        return Distribution(value("mean"), value("p50"), value("p90"), value("p95"), value("p99"), int(raw["count"]))

    levels = [
        LevelSummary(
            **{
                **level,
                **{key: dist(level[key]) for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s")},
                "errors": tuple(level["errors"]),
            }
        )
        for level in data["levels"]
    ]
    return data["meta"], levels
