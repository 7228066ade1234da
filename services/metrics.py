"""Every Prometheus metric of the deployment, defined once (docs/design.md §6).

Dashboards, alert rules, the planner and KEDA triggers use exactly these names; tests read
them from `METRIC_SPECS`. The gateway exports request-level metrics (role="gateway"); workers
export engine metrics with their role ("prefill", "decode" or "worker") and the gateway
re-exports them, so one scrape of the gateway's /metrics covers a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MetricKind = Literal["histogram", "gauge", "counter"]

# Latency buckets (seconds) from sub-10 ms CPU-free TPOT up to multi-minute e2e on CPUs.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
ACCEPT_LENGTH_BUCKETS = tuple(float(n) for n in range(1, 34))


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


_ML = ("model", "role")

METRIC_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "dspark_time_to_first_token_seconds",
        "histogram",
        "Time from the gateway receiving a request to its first content byte sent.",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_time_per_output_token_seconds",
        "histogram",
        "Per request: (e2e - TTFT) / (output tokens - 1).",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_inter_token_latency_seconds",
        "histogram",
        "Time between consecutive streamed tokens (per token).",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_e2e_request_latency_seconds",
        "histogram",
        "Time from arrival to the last byte of the response.",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_request_queue_time_seconds",
        "histogram",
        "Time from arrival until a worker starts its prefill.",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_request_prefill_time_seconds",
        "histogram",
        "Time a worker spends on a request's prefill (to its first token).",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_kv_transfer_time_seconds",
        "histogram",
        "Time to hand a request's KV from the prefill to the decode worker.",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_request_decode_time_seconds",
        "histogram",
        "Time from the first token to the last.",
        _ML,
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "dspark_spec_accept_length",
        "histogram",
        "Tokens committed per DSpark verify (accepted drafts + bonus).",
        _ML,
        ACCEPT_LENGTH_BUCKETS,
    ),
    MetricSpec("dspark_num_requests_running", "gauge", "Requests being decoded.", _ML),
    MetricSpec("dspark_num_requests_waiting", "gauge", "Requests queued for a worker.", _ML),
    MetricSpec("dspark_kv_cache_usage_ratio", "gauge", "Fraction of KV slots in use (0..1).", _ML),
    MetricSpec("dspark_requests_total", "counter", "Finished requests by status.", (*_ML, "status")),
    MetricSpec(
        "dspark_request_migrations_total",
        "counter",
        "Requests moved to another worker when theirs died (worker_down) or drained (drain).",
        (*_ML, "reason"),
    ),
    MetricSpec("dspark_prompt_tokens_total", "counter", "Prompt tokens processed.", _ML),
    MetricSpec("dspark_generation_tokens_total", "counter", "Tokens generated.", _ML),
    MetricSpec("dspark_prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.", _ML),
    MetricSpec("dspark_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", _ML),
    MetricSpec("dspark_spec_draft_tokens_total", "counter", "Tokens drafted by DSpark.", _ML),
    MetricSpec("dspark_spec_accepted_tokens_total", "counter", "Drafted tokens accepted by the target.", _ML),
    MetricSpec(
        "dspark_spec_undrafted_tokens_total",
        "counter",
        "Tokens DSpark decoded without drafting (decode steps over --speculative-max-batch-size).",
        _ML,
    ),
)

METRIC_NAMES: frozenset[str] = frozenset(s.name for s in METRIC_SPECS)


def exported_series_names(spec: MetricSpec) -> tuple[str, ...]:
    """Names Prometheus stores for a metric (histograms expand to _bucket/_sum/_count)."""
    if spec.kind == "histogram":
        return (f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count")
    return (spec.name,)


class Metrics:
    """The metric objects, registered in one registry (a fresh one per process by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._by_name: dict[str, Histogram | Gauge | Counter] = {}
        for spec in METRIC_SPECS:
            if spec.kind == "histogram":
                metric: Histogram | Gauge | Counter = Histogram(
                    spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=self.registry
                )
            elif spec.kind == "gauge":
                metric = Gauge(spec.name, spec.help, spec.labels, registry=self.registry)
            else:
                # prometheus_client appends _total itself; give it the bare name.
                metric = Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=self.registry)
            self._by_name[spec.name] = metric

    def histogram(self, name: str) -> Histogram:
        metric = self._by_name[name]
        assert isinstance(metric, Histogram), name
        return metric

    def gauge(self, name: str) -> Gauge:
        metric = self._by_name[name]
        assert isinstance(metric, Gauge), name
        return metric

    def counter(self, name: str) -> Counter:
        metric = self._by_name[name]
        assert isinstance(metric, Counter), name
        return metric
