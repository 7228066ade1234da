"""Bench runs of several servers side by side: one Markdown table with the ratio of each run to
a reference run (by default the last one), a JSON with every run and ratio, and one PNG.

    python -m services.bench.compare ours=A/bench_agentic.json peer=B/bench_agentic.json --out STEM

Each input is the JSON `dspark-serve bench` writes; only the concurrency levels that every
run measured are compared. A ratio is run / reference: below 1 the run is faster on a
latency, above 1 it serves more tokens/s or requests/s.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from services.bench.report import Distribution, LevelSummary, read_json

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"))
STATS = ("mean", "p50", "p90", "p99")
LineStyle = Literal["-", "--", ":"]


@dataclass(frozen=True)
class BenchRun:
    label: str
    meta: dict[str, Any]
    levels: tuple[LevelSummary, ...]

    @staticmethod
    def load(path: Path, label: str | None = None) -> BenchRun:
        meta, levels = read_json(path)
        return BenchRun(label or str(meta.get("label") or path.parent.name), meta, tuple(levels))

    def level(self, concurrency: int) -> LevelSummary:
        return next(s for s in self.levels if s.concurrency == concurrency)


def common_levels(runs: Sequence[BenchRun]) -> list[int]:
    """Concurrency levels every run measured, in the first run's order."""
    measured = [{s.concurrency for s in run.levels} for run in runs]
    return [s.concurrency for s in runs[0].levels if all(s.concurrency in levels for levels in measured)]


def _ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


@dataclass(frozen=True)
class LevelRatio:
    """`numerator / denominator` for one concurrency level: rates and latency statistics."""

    concurrency: int
    numerator: str
    denominator: str
    qps: float
    output_tokens_per_s: float
    latencies: dict[str, dict[str, float]]  # metric ("ttft_s") -> statistic ("p50") -> ratio


def level_ratio(first: BenchRun, other: BenchRun, concurrency: int) -> LevelRatio:
    a, b = first.level(concurrency), other.level(concurrency)
    return LevelRatio(
        concurrency=concurrency,
        numerator=first.label,
        denominator=other.label,
        qps=_ratio(a.qps, b.qps),
        output_tokens_per_s=_ratio(a.output_tokens_per_s, b.output_tokens_per_s),
        latencies={
            metric: {
                stat: _ratio(getattr(getattr(a, metric), stat), getattr(getattr(b, metric), stat)) for stat in STATS
            }
            for metric, _ in LATENCIES
        },
    )


def ratios(runs: Sequence[BenchRun], reference: BenchRun) -> list[LevelRatio]:
    """`run / reference` for every other run, per common concurrency level."""
    others = [run for run in runs if run is not reference]
    return [level_ratio(run, reference, c) for c in common_levels(runs) for run in others]


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.0f}" if value >= 1 else f"{value * 1000:.1f}"


def _times(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _stats(dist: Distribution) -> str:
    return " / ".join(_ms(getattr(dist, stat)) for stat in STATS)


def side_by_side_table(runs: Sequence[BenchRun], reference: BenchRun) -> str:
    """One row per run and concurrency level, then a row of ratios (run / reference) per other run."""
    head = (
        "| conc | server | reqs | fail | QPS | out tok/s | "
        + " | ".join(f"{name} mean / p50 / p90 / p99 (ms)" for _, name in LATENCIES)
        + " |"
    )
    rows = [head, "|---:|---|---:|---:|---:|---:|" + "---:|" * len(LATENCIES)]
    by_level = {(r.concurrency, r.numerator): r for r in ratios(runs, reference)}
    for concurrency in common_levels(runs):
        for run in runs:
            s = run.level(concurrency)
            latencies = " | ".join(_stats(getattr(s, metric)) for metric, _ in LATENCIES)
            rows.append(
                f"| {concurrency} | {run.label} | {s.completed} | {s.failed} | {s.qps:.3f} "
                f"| {s.output_tokens_per_s:.1f} | {latencies} |"
            )
        for run in runs:
            if run is reference:
                continue
            ratio = by_level[(concurrency, run.label)]
            latencies = " | ".join(
                " / ".join(_times(ratio.latencies[metric][stat]) for stat in STATS) for metric, _ in LATENCIES
            )
            rows.append(
                f"| {concurrency} | **{run.label} / {reference.label}** | | | **{_times(ratio.qps)}** "
                f"| **{_times(ratio.output_tokens_per_s)}** | {latencies} |"
            )
    return "\n".join(rows)


def _finite(value: Any) -> Any:
    """NaN -> None, recursively: the JSON stays strict."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_comparison_json(path: Path, meta: dict[str, Any], runs: Sequence[BenchRun], reference: BenchRun) -> None:
    payload = {
        "meta": meta,
        "reference": reference.label,
        "runs": [{"label": r.label, "meta": r.meta, "levels": [asdict(s) for s in r.levels]} for r in runs],
        "ratios": [asdict(r) for r in ratios(runs, reference)],
    }
    path.write_text(json.dumps(_finite(payload), indent=2) + "\n")


def write_comparison_plot(path: Path, title: str, runs: Sequence[BenchRun], reference: BenchRun) -> None:
    """Colour = server. Top: latency percentiles (line style = statistic). Bottom: output tokens/s,
    requests/s, and the ratios to the reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    levels = common_levels(runs)
    colors = dict(zip((r.label for r in runs), plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    servers = [Line2D([], [], color=colors[r.label], marker="o", label=r.label) for r in runs]

    def style_legend(ax: Any, styles: Sequence[tuple[str, LineStyle]]) -> None:
        handles = [Line2D([], [], color="black", linestyle=style, label=name) for name, style in styles]
        ax.legend(handles=servers + handles, fontsize=7)

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    percentile_styles: tuple[tuple[str, LineStyle], ...] = (("p50", "-"), ("p90", "--"), ("p99", ":"))
    for ax, (metric, name) in zip(axes[0], LATENCIES, strict=True):
        for run in runs:
            for stat, style in percentile_styles:
                values = [getattr(getattr(run.level(c), metric), stat) * 1000 for c in levels]
                ax.plot(levels, values, style, color=colors[run.label], marker="o", markersize=3)
        ax.set_title(name)
        ax.set_ylabel(f"{name} (ms)")
        ax.set_yscale("log")
        style_legend(ax, percentile_styles)
    for ax, attr, ylabel in ((axes[1][0], "output_tokens_per_s", "output tokens/s"), (axes[1][1], "qps", "requests/s")):
        for run in runs:
            ax.plot(levels, [getattr(run.level(c), attr) for c in levels], color=colors[run.label], marker="o")
        ax.set_title(ylabel)
        ax.set_ylabel(ylabel)
        ax.legend(handles=servers, fontsize=7)
    ratio_ax = axes[1][2]
    ratio_styles: tuple[tuple[str, LineStyle], ...] = (("TTFT p50", "-"), ("TPOT p50", "--"), ("output tok/s", ":"))
    for run in runs:
        if run is reference:
            continue
        level_ratios = [level_ratio(run, reference, c) for c in levels]
        series = (
            [r.latencies["ttft_s"]["p50"] for r in level_ratios],
            [r.latencies["tpot_s"]["p50"] for r in level_ratios],
            [r.output_tokens_per_s for r in level_ratios],
        )
        for (_, style), values in zip(ratio_styles, series, strict=True):
            ratio_ax.plot(levels, values, style, color=colors[run.label], marker="o", markersize=3)
    ratio_ax.axhline(1.0, color="grey", linewidth=1)
    ratio_ax.set_yscale("log")
    ratio_ax.set_title(f"ratio to {reference.label}")
    ratio_ax.set_ylabel("latency: < 1 is faster; tok/s: > 1 is more")
    servers = [h for h in servers if h.get_label() != reference.label]
    style_legend(ratio_ax, ratio_styles)
    for row in axes:
        for ax in row:
            ax.set_xlabel("concurrency")
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.grid(True, alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_comparison(
    stem: Path, title: str, meta: dict[str, Any], runs: Sequence[BenchRun], reference: str | None = None
) -> str:
    """STEM.json, STEM.png and STEM.md, with ratios to the run labelled `reference` (default: the
    last run); returns the table."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs")
    if len({r.label for r in runs}) != len(runs):
        raise ValueError(f"labels must differ: {[r.label for r in runs]}")
    if not common_levels(runs):
        raise ValueError("the runs share no concurrency level")
    base = runs[-1] if reference is None else next((r for r in runs if r.label == reference), None)
    if base is None:
        raise ValueError(f"no run is labelled {reference!r}: {[r.label for r in runs]}")
    stem.parent.mkdir(parents=True, exist_ok=True)
    table = side_by_side_table(runs, base)
    write_comparison_json(stem.with_suffix(".json"), meta, runs, base)
    write_comparison_plot(stem.with_suffix(".png"), title, runs, base)
    stem.with_suffix(".md").write_text(table + "\n")
    return table


def _labelled_path(text: str) -> tuple[str | None, Path]:
    label, sep, path = text.partition("=")
    return (label, Path(path)) if sep else (None, Path(text))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("runs", nargs="+", type=_labelled_path, help="[LABEL=]bench JSON, in table order")
    parser.add_argument("--reference", default=None, help="label of the run others are divided by (default: last)")
    parser.add_argument("--out", type=Path, required=True, help="output stem: STEM.json, STEM.png, STEM.md")
    parser.add_argument("--title", default="bench: side by side")
    args = parser.parse_args(argv)
    runs = [BenchRun.load(path, label) for label, path in args.runs]
    print(write_comparison(args.out, args.title, {"inputs": [str(p) for _, p in args.runs]}, runs, args.reference))


if __name__ == "__main__":
    main()
