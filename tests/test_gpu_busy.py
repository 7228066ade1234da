"""The GPU-busy share's arithmetic (benchmarks/gpu_busy.py): overlapping device intervals
count once, gaps not at all."""

from __future__ import annotations

from benchmarks.gpu_busy import BusyShare, union_ns


def test_overlapping_intervals_count_once_and_gaps_not_at_all() -> None:
    assert union_ns([]) == 0
    assert union_ns([(0, 10)]) == 10
    assert union_ns([(20, 25), (0, 10), (5, 15), (21, 22)]) == 20  # [0, 15) and [20, 25)
    assert union_ns([(0, 10), (10, 20)]) == 20  # touching, not overlapping
    assert union_ns([(0, 100), (10, 20), (30, 40)]) == 100  # nested


def test_device_ms_per_step() -> None:
    assert BusyShare(steps=4, busy_ms=10.0, span_ms=12.5, busy_share=0.8).device_ms_per_step == 2.5
