"""How much of the time the GPU was computing over a window of engine steps, from the profiler.

A `BusyWindow` wraps some engine steps in `torch.profiler` (device activity only, so the host
side is barely slowed) and reads every kernel, copy and memset the device ran. Their intervals
overlap when streams run concurrently, so the busy time is the length of their union; the
share is that over the device timeline's span (first start to last end), which for a sync-free
loop matches the host's wall time over the same steps to within one step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

TOP_KERNELS = 30  # kept in the JSON; reports print fewer


@dataclass(frozen=True)
class BusyShare:
    steps: int
    busy_ms: float  # union of the device's activity intervals
    span_ms: float  # first device activity to last
    busy_share: float  # busy_ms / span_ms
    top_kernels: tuple[tuple[str, float], ...] = ()  # (name, total ms), the most device time first

    @property
    def device_ms_per_step(self) -> float:
        return self.busy_ms / max(self.steps, 1)


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of half-open [start, end) intervals."""
    total, covered_to = 0, None
    for start, end in sorted(intervals):
        if covered_to is None or start >= covered_to:
            total += end - start
            covered_to = end
        elif end > covered_to:
            total += end - covered_to
            covered_to = end
    return total


class BusyWindow:
    """Profiles the steps run between `start()` and `stop(steps)`."""

    def __init__(self) -> None:
        self._prof = profile(activities=[ProfilerActivity.CUDA])

    def start(self) -> None:
        self._prof.start()

    def stop(self, steps: int) -> BusyShare:
        torch.cuda.synchronize()
        self._prof.stop()
        results = self._prof.profiler.kineto_results  # type: ignore[union-attr]
        events = [e for e in results.events() if e.device_type() == DeviceType.CUDA and e.duration_ns() > 0]
        intervals = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events]
        by_name: dict[str, int] = defaultdict(int)
        for e in events:
            by_name[e.name()] += e.duration_ns()
        top = sorted(by_name.items(), key=lambda item: -item[1])[:TOP_KERNELS]
        if not intervals:
            raise RuntimeError("the profiler saw no device activity in the window")
        busy = union_ns(intervals)
        span = max(end for _, end in intervals) - min(start for start, _ in intervals)
        return BusyShare(steps, busy / 1e6, span / 1e6, busy / span, tuple((n, ns / 1e6) for n, ns in top))
