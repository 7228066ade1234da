"""The PNG of one bench run, against concurrency: the percentiles of each latency (every point
marked with its sample count n), throughput, and the requests that completed and failed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.bench.report import Distribution, LevelSummary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "end-to-end latency"))
PLOTTED_PERCENTILES = ("p50", "p90", "p99")


def _latency_panel(ax: Any, levels: Sequence[int], dists: Sequence[Distribution], name: str) -> None:
    for stat in PLOTTED_PERCENTILES:
        ax.plot(levels, [getattr(d, stat) * 1000 for d in dists], marker="o", label=stat)
    for concurrency, dist in zip(levels, dists, strict=True):
        if not math.isnan(dist.p50):
            ax.annotate(
                f"n={dist.count}",
                (concurrency, dist.p50 * 1000),
                textcoords="offset points",
                xytext=(0, -12),
                ha="center",
                fontsize=7,
            )
    ax.margins(y=0.15)  # room for the n below the lowest point
    ax.set_title(name)
    ax.set_ylabel(f"{name} (ms)")
    ax.legend(fontsize=8)


def _error_rate_percent(summary: LevelSummary) -> float:
    sent = summary.completed + summary.failed
    return 100.0 * summary.failed / sent if sent else math.nan


def plot_figure(title: str, summaries: Sequence[LevelSummary]) -> Figure:
    """Eight panels: TTFT, TPOT, ITL, end-to-end latency; tokens/s, requests/s, requests
    completed and failed per level, and the failed share."""
    from matplotlib.figure import Figure

    levels = [s.concurrency for s in summaries]
    fig = Figure(figsize=(18, 8))
    axes = fig.subplots(2, 4)
    for ax, (attr, name) in zip(axes[0], LATENCIES, strict=True):
        _latency_panel(ax, levels, [getattr(s, attr) for s in summaries], name)
    tokens_ax, qps_ax, requests_ax, errors_ax = axes[1]
    tokens_ax.plot(levels, [s.output_tokens_per_s for s in summaries], marker="o", label="output")
    tokens_ax.plot(levels, [s.total_tokens_per_s for s in summaries], marker="o", label="total")
    tokens_ax.set_title("throughput")
    tokens_ax.set_ylabel("tokens/s")
    tokens_ax.legend(fontsize=8)
    qps_ax.plot(levels, [s.qps for s in summaries], marker="o")
    qps_ax.set_title("completed requests/s")
    qps_ax.set_ylabel("requests/s")
    requests_ax.plot(levels, [s.completed for s in summaries], marker="o", label="completed")
    requests_ax.plot(levels, [s.failed for s in summaries], marker="x", color="tab:red", label="failed")
    requests_ax.set_title("requests per level")
    requests_ax.set_ylabel("requests")
    requests_ax.legend(fontsize=8)
    errors_ax.plot(levels, [_error_rate_percent(s) for s in summaries], marker="x", color="tab:red")
    errors_ax.set_title("failed requests")
    errors_ax.set_ylabel("% of requests sent")
    errors_ax.set_ylim(bottom=0)
    for row in axes:
        for ax in row:
            ax.set_xlabel("concurrency")
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def write_plots(path: Path, title: str, summaries: Sequence[LevelSummary]) -> None:
    plot_figure(title, summaries).savefig(path, dpi=110)
