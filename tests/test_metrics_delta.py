"""benchmarks/metrics_delta.py reads real Prometheus scrapes: histogram sums and counts over
every label, so two scrapes give the mean of what was observed between them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from benchmarks.metrics_delta import histogram_totals


def test_histogram_totals_sum_over_labels_and_skip_other_types() -> None:
    registry = CollectorRegistry()
    ttft = Histogram("demo_ttft_seconds", "ttft", ["role"], registry=registry)
    Counter("demo_requests", "requests", registry=registry).inc(5)
    ttft.labels("prefill").observe(0.5)
    before = histogram_totals(generate_latest(registry).decode())
    ttft.labels("prefill").observe(0.25)
    ttft.labels("decode").observe(0.75)
    after = histogram_totals(generate_latest(registry).decode())
    assert before == {"demo_ttft_seconds": (0.5, 1.0)}
    total, count = after["demo_ttft_seconds"]
    assert (total, count) == (1.5, 3.0)
    assert (total - before["demo_ttft_seconds"][0]) / (count - before["demo_ttft_seconds"][1]) == 0.5
