"""Recording metrics at the gateway (docs/metrics.md says which metric comes from where).

`RequestTimer` follows one HTTP request as the client sees it (arrival, content sent);
`RequestMetrics` counts requests by HTTP status, observes latencies (role="gateway") and the
request's phases (role = the worker role that ran the phase), counts the tokens served
through the gateway and keeps the gateway's running/waiting gauges. `WorkerStatsExporter`
re-exports the engine stats the gateway polls from its workers with role = the worker's role,
so one scrape of the gateway covers the deployment. Worker counters restart at zero when a
worker restarts; the exporter adds deltas per worker instance, so the exported counters stay
monotonic. At debug level each served request logs where its first token's time went
(`first_token_hops`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.gateway.tracked import Tracked
from services.metrics import Metrics

GATEWAY_ROLE = "gateway"
UNKNOWN_MODEL = "unknown"  # label of requests that name no served model (never echo user input)
CLIENT_CLOSED = 499  # the client disconnected before the response was complete (nginx's code)

logger = logging.getLogger(__name__)


@dataclass
class RequestTimer:
    arrival_s: float  # perf_counter
    first_content_s: float | None = None
    last_content_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # one entry per token after the first chunk

    def content_sent(self, num_tokens: int, now: float | None = None) -> None:
        """A chunk carrying `num_tokens` new tokens reached the client's connection."""
        now = time.perf_counter() if now is None else now
        if self.first_content_s is None:
            self.first_content_s = now
        elif num_tokens > 0 and self.last_content_s is not None:
            per_token = (now - self.last_content_s) / num_tokens
            self.itl_s.extend([per_token] * num_tokens)
        if num_tokens > 0 or self.last_content_s is None:
            self.last_content_s = now


class InflightRequest:
    """Moves one HTTP request through the gateway's waiting -> running gauges, exactly once."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._waiting = metrics.gauge("dspark_num_requests_waiting").labels(model, GATEWAY_ROLE)
        self._running = metrics.gauge("dspark_num_requests_running").labels(model, GATEWAY_ROLE)
        self._state = "waiting"
        self._waiting.inc()

    def started(self) -> None:
        if self._state == "waiting":
            self._waiting.dec()
            self._running.inc()
            self._state = "running"

    def ended(self) -> None:
        if self._state == "waiting":
            self._waiting.dec()
        elif self._state == "running":
            self._running.dec()
        self._state = "ended"


_QUEUE, _PREFILL = "dspark_request_queue_time_seconds", "dspark_request_prefill_time_seconds"
_TRANSFER, _DECODE = "dspark_kv_transfer_time_seconds", "dspark_request_decode_time_seconds"
_PHASES_BY_ROLE = {
    "prefill": (_QUEUE, _PREFILL),
    "decode": (_TRANSFER, _DECODE),
    "worker": (_QUEUE, _PREFILL, _DECODE),
}


class RequestMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def declare(self, model: str, worker_role: str) -> None:
        """Create the series a deployment with a worker of `worker_role` will fill, at zero,
        so that rate() sees their first increase (a series born with its first observation
        has no earlier sample to compare with)."""
        m = self.metrics
        gateway = (model, GATEWAY_ROLE)
        for name in (
            "dspark_time_to_first_token_seconds",
            "dspark_time_per_output_token_seconds",
            "dspark_inter_token_latency_seconds",
            "dspark_e2e_request_latency_seconds",
        ):
            m.histogram(name).labels(*gateway)
        m.counter("dspark_requests_total").labels(*gateway, "200")
        m.counter("dspark_prompt_tokens_total").labels(*gateway)
        m.counter("dspark_generation_tokens_total").labels(*gateway)
        for reason in ("worker_down", "drain"):
            m.counter("dspark_request_migrations_total").labels(*gateway, reason)
        m.gauge("dspark_num_requests_waiting").labels(*gateway)
        m.gauge("dspark_num_requests_running").labels(*gateway)
        for name in _PHASES_BY_ROLE.get(worker_role, ()):
            m.histogram(name).labels(model, worker_role)

    def migrated(self, model: str, reason: str) -> None:
        self.metrics.counter("dspark_request_migrations_total").labels(model, GATEWAY_ROLE, reason).inc()

    def count(self, model: str, status: int) -> None:
        self.metrics.counter("dspark_requests_total").labels(model, GATEWAY_ROLE, str(status)).inc()

    def inflight(self, model: str) -> InflightRequest:
        return InflightRequest(self.metrics, model)

    def finished(
        self,
        model: str,
        timer: RequestTimer,
        tracked: Sequence[Tracked],
        status: int,
        prompt_tokens: int,
        completion_tokens: int,
        max_choice_tokens: int,
        end_s: float | None = None,
    ) -> None:
        """Count the request and its tokens; for a served one (200) observe its latencies
        and phases."""
        m = self.metrics
        labels = (model, GATEWAY_ROLE)
        self.count(model, status)
        if prompt_tokens:
            m.counter("dspark_prompt_tokens_total").labels(*labels).inc(prompt_tokens)
        if completion_tokens:
            m.counter("dspark_generation_tokens_total").labels(*labels).inc(completion_tokens)
        if status != 200:
            return
        end = time.perf_counter() if end_s is None else end_s
        e2e = end - timer.arrival_s
        m.histogram("dspark_e2e_request_latency_seconds").labels(*labels).observe(e2e)
        if timer.first_content_s is not None:
            ttft = timer.first_content_s - timer.arrival_s
            m.histogram("dspark_time_to_first_token_seconds").labels(*labels).observe(ttft)
            if max_choice_tokens > 1:
                m.histogram("dspark_time_per_output_token_seconds").labels(*labels).observe(
                    max(0.0, e2e - ttft) / (max_choice_tokens - 1)
                )
        itl = m.histogram("dspark_inter_token_latency_seconds").labels(*labels)
        for value in timer.itl_s:
            itl.observe(value)
        last = max(
            (t for t in tracked if t.first_token_s is not None),
            key=lambda t: t.last_token_s or 0.0,
            default=None,
        )
        if last is not None:
            self._phases(model, last)
        if logger.isEnabledFor(logging.DEBUG):
            for t in tracked:
                hops = first_token_hops(timer, t)
                if hops is not None:
                    logger.debug(
                        "request %s first token hops ms: %s",
                        t.request_id,
                        " ".join(f"{name}={1e3 * s:.1f}" for name, s in hops.items()),
                    )

    def _phases(self, model: str, t: Tracked) -> None:
        """queue + prefill (+ transfer) + decode partition arrival -> last token on the
        gateway clock; the prefill share comes from the engine. Each phase carries the role of
        the worker that ran it (the transfer: the receiving decode worker)."""
        assert t.first_token_s is not None
        m = self.metrics
        to_first = t.first_token_s - t.arrival_s
        prefill = min(t.prefill_s, to_first) if t.prefill_s is not None else to_first
        last = t.last_token_s or t.first_token_s
        first_role = (model, t.first_role)
        # a request that ended at its first token never left the worker that prefilled it
        decode_role = (model, t.decode_role if t.handoff_s is not None else t.first_role)
        m.histogram("dspark_request_queue_time_seconds").labels(*first_role).observe(max(0.0, to_first - prefill))
        m.histogram("dspark_request_prefill_time_seconds").labels(*first_role).observe(prefill)
        decode_from = t.first_token_s
        if t.handoff_s is not None:
            decode_from = min(max(t.decode_start_s or last, t.handoff_s), last)
            transfer = m.histogram("dspark_kv_transfer_time_seconds").labels(*decode_role)
            transfer.observe(decode_from - t.handoff_s)
        decode = m.histogram("dspark_request_decode_time_seconds").labels(*decode_role)
        decode.observe(max(0.0, last - decode_from))


def first_token_hops(timer: RequestTimer, t: Tracked) -> dict[str, float] | None:
    """Arrival -> first content byte of one choice, hop by hop (seconds), on the gateway's
    clock and the worker's (perf_counter: one clock on one host; across hosts the hops
    `submit` and `back` absorb the offset): `prepare` body to worker call (JSON, validation,
    chat template, tokenising, routing), `submit` the call reaching the worker, `wait` the
    worker's step thread and engine queue until the request is scheduled, `prefill` scheduled
    to first token in the engine, `back` the engine's output to the gateway (outbox, long
    poll), `send` the gateway's output to the client's connection. None for a choice that
    moved between workers or whose times are incomplete."""
    w = t.worker_timings
    if (
        t.migrations
        or w is None
        or w.first_scheduled_s is None
        or w.first_token_s is None
        or t.submitted_s is None
        or t.first_token_s is None
        or timer.first_content_s is None
    ):
        return None
    return {
        "prepare": t.submitted_s - timer.arrival_s,
        "submit": w.arrival_s - t.submitted_s,
        "wait": w.first_scheduled_s - w.arrival_s,
        "prefill": w.first_token_s - w.first_scheduled_s,
        "back": t.first_token_s - w.first_token_s,
        "send": timer.first_content_s - t.first_token_s,
    }


_COUNTERS = (
    ("prompt_tokens_total", "dspark_prompt_tokens_total"),
    ("generation_tokens_total", "dspark_generation_tokens_total"),
    ("prefix_cache_hits_total", "dspark_prefix_cache_hits_total"),
    ("prefix_cache_queries_total", "dspark_prefix_cache_queries_total"),
    ("spec_draft_tokens_total", "dspark_spec_draft_tokens_total"),
    ("spec_accepted_tokens_total", "dspark_spec_accepted_tokens_total"),
    ("spec_undrafted_tokens_total", "dspark_spec_undrafted_tokens_total"),
)


@dataclass
class _WorkerState:
    model: str
    role: str
    instance_id: str
    stats: Any
    live: bool = True


class WorkerStatsExporter:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._workers: dict[str, _WorkerState] = {}

    def update(self, replica_id: str, role: str, model: str, instance_id: str, stats: Any) -> None:
        previous = self._workers.get(replica_id)
        same = previous is not None and previous.instance_id == instance_id
        m = self.metrics
        for attr, name in _COUNTERS:
            now = int(getattr(stats, attr, 0) or 0)
            before = int(getattr(previous.stats, attr, 0) or 0) if same and previous else 0
            if now > before:
                m.counter(name).labels(model, role).inc(now - before)
        counts = tuple(getattr(stats, "spec_accept_length_counts", ()) or ())
        before_counts = (
            tuple(getattr(previous.stats, "spec_accept_length_counts", ()) or ()) if same and previous else ()
        )
        histogram = m.histogram("dspark_spec_accept_length").labels(model, role)
        for length, count in enumerate(counts):
            delta = count - (before_counts[length] if length < len(before_counts) else 0)
            for _ in range(max(0, delta)):
                histogram.observe(length)
        self._workers[replica_id] = _WorkerState(model, role, instance_id, stats)
        self._refresh_gauges()

    def set_live(self, replica_id: str, live: bool) -> None:
        state = self._workers.get(replica_id)
        if state is not None and state.live != live:
            state.live = live
            self._refresh_gauges()

    def remove(self, replica_id: str) -> None:
        if self._workers.pop(replica_id, None) is not None:
            self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        groups: dict[tuple[str, str], list[Any]] = {}
        for state in self._workers.values():
            groups.setdefault((state.model, state.role), [])
            if state.live:
                groups[(state.model, state.role)].append(state.stats)
        m = self.metrics
        for (model, role), stats in groups.items():
            m.gauge("dspark_num_requests_running").labels(model, role).set(
                sum(int(getattr(s, "num_running", 0)) for s in stats)
            )
            m.gauge("dspark_num_requests_waiting").labels(model, role).set(
                sum(int(getattr(s, "num_waiting", 0)) for s in stats)
            )
            total = sum(int(getattr(s, "kv_total_slots", 0)) for s in stats)
            used = sum(int(getattr(s, "kv_used_slots", 0)) for s in stats)
            ratio = used / total if total else 0.0
            m.gauge("dspark_kv_cache_usage_ratio").labels(model, role).set(ratio)
