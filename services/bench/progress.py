"""Live progress of a bench run on stderr, one concurrency level at a time.

On a terminal a tqdm bar per level (requests done of --num-requests, or seconds of
--duration) with the level's running counts; where stderr is a log (CI, a pipe) a plain
line every `interval_s` seconds and one when the level ends, so no carriage returns or
redraws land in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TextIO

from tqdm import tqdm

from services.bench.client import RequestResult
from services.bench.report import percentile

PROGRESS_MODES = ("auto", "bar", "lines", "off")
BAR_REFRESH_S = 0.5

ResultSink = Callable[[RequestResult], None]


@dataclass
class LevelTally:
    """What one level has done so far; `record` is called once per finished request."""

    concurrency: int
    duration_s: float | None  # the level's bound: exactly one of these is set
    num_requests: int | None
    started_s: float  # perf_counter
    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_total_s: float = 0.0
    itl_count: int = 0

    def record(self, result: RequestResult) -> None:
        if not result.ok:
            self.failed += 1
            return
        self.ok += 1
        self.output_tokens += result.output_tokens
        if result.ttft_s is not None:
            self.ttft_s.append(result.ttft_s)
        self.itl_total_s += sum(result.itl_s)
        self.itl_count += len(result.itl_s)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started_s

    def position(self) -> str:
        """How far the level is: requests of its budget, or seconds of its duration."""
        if self.num_requests is not None:
            return f"{self.ok + self.failed}/{self.num_requests} requests"
        return f"{min(self.elapsed_s(), self.duration_s or 0.0):.0f}/{self.duration_s:g} s"

    def rates(self) -> str:
        parts = [
            f"{self.ok} ok",
            f"{self.failed} failed",
            f"{self.output_tokens / max(self.elapsed_s(), 1e-9):.1f} out tok/s",
        ]
        if self.ttft_s:
            parts.append(f"TTFT p50 {percentile(self.ttft_s, 50) * 1000:.0f} ms")
        if self.itl_count:
            parts.append(f"ITL mean {self.itl_total_s / self.itl_count * 1000:.1f} ms")
        return ", ".join(parts)


class _Bar:
    def __init__(self, tally: LevelTally, stream: TextIO) -> None:
        by_requests = tally.num_requests is not None
        self.tally = tally
        self.bar = tqdm(
            total=tally.num_requests if by_requests else tally.duration_s,
            desc=f"c={tally.concurrency}",
            unit="req" if by_requests else "s",
            file=stream,
            dynamic_ncols=True,
            bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:g} {unit} [{elapsed}]{postfix}",
        )

    def tick(self) -> None:
        if self.tally.num_requests is None:
            self.bar.n = min(self.tally.elapsed_s(), self.tally.duration_s or 0.0)
        else:
            self.bar.n = self.tally.ok + self.tally.failed
        self.bar.set_postfix_str(self.tally.rates(), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.tick()
        self.bar.close()


class _Lines:
    def __init__(self, tally: LevelTally, stream: TextIO) -> None:
        self.tally = tally
        self.stream = stream

    def tick(self) -> None:
        self._print(self.tally.position())

    def close(self) -> None:
        self._print(f"done in {self.tally.elapsed_s():.1f} s")

    def _print(self, where: str) -> None:
        print(f"bench: c={self.tally.concurrency} {where}: {self.tally.rates()}", file=self.stream, flush=True)


class BenchProgress:
    """`mode`: bar, lines, off, or auto (a bar when `stream` is a terminal, else lines)."""

    def __init__(self, mode: str = "auto", interval_s: float = 10.0, stream: TextIO | None = None) -> None:
        if mode not in PROGRESS_MODES:
            raise ValueError(f"progress mode must be one of {PROGRESS_MODES}, got {mode!r}")
        if interval_s <= 0:
            raise ValueError(f"progress interval must be > 0 seconds, got {interval_s}")
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode
        self.interval_s = interval_s

    @contextlib.asynccontextmanager
    async def level(
        self, concurrency: int, *, duration_s: float | None, num_requests: int | None
    ) -> AsyncIterator[ResultSink]:
        """Show one level while the body runs; yields the callback for each finished request."""
        tally = LevelTally(concurrency, duration_s, num_requests, time.perf_counter())
        if self.mode == "off":
            yield tally.record
            return
        view = _Bar(tally, self.stream) if self.mode == "bar" else _Lines(tally, self.stream)
        period_s = BAR_REFRESH_S if self.mode == "bar" else self.interval_s

        async def refresh() -> None:
            while True:
                await asyncio.sleep(period_s)
                view.tick()

        ticker = asyncio.create_task(refresh())
        try:
            yield tally.record
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            view.close()
