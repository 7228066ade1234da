"""Reads the planner's signals from Prometheus with instant queries (`/api/v1/query`).

The queries follow charts/dspark-serve/files/rules.yaml but do not depend on its recorded
series: the planner works against any Prometheus that scrapes the gateway. Worker gauges are
re-exported by every gateway pod, so they are de-duplicated with `max without (instance, pod)`
before they are summed. A query with no series, or a quantile over no requests (NaN), reads
as None.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import httpx

from services.planner.policy import Signals

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\d+(ms|s|m|h)$")


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused a query: the planner holds."""


@dataclass(frozen=True)
class SignalQueries:
    model: str = ""  # regex on the `model` label; empty: every model
    selector: str = ""  # extra label matchers, e.g. 'namespace="serving"'
    window: str = "2m"  # rate window of the latency quantiles
    quantile: float = 0.95

    def __post_init__(self) -> None:
        if not _DURATION.match(self.window):
            raise ValueError(f"window must be a Prometheus duration like 2m or 30s, got {self.window!r}")
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")

    def _matchers(self, role: str) -> str:
        matchers = [f'role="{role}"']
        if self.model:
            matchers.append(f'model=~"{self.model}"')
        if self.selector:
            matchers.append(self.selector)
        return "{" + ",".join(matchers) + "}"

    def latency_p95(self, metric: str) -> str:
        # TTFT and TPOT are observed per request by the gateway (role="gateway").
        return (
            f"histogram_quantile({self.quantile}, sum by (le) "
            f"(rate({metric}_bucket{self._matchers('gateway')}[{self.window}])))"
        )

    def waiting(self, role: str) -> str:
        return f"sum(max without (instance, pod) (dspark_num_requests_waiting{self._matchers(role)}))"

    def kv_usage(self, role: str) -> str:
        return f"max(dspark_kv_cache_usage_ratio{self._matchers(role)})"


class PrometheusReader:
    def __init__(self, url: str, queries: SignalQueries, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.queries = queries
        self._client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def query_scalar(self, expr: str) -> float | None:
        """The single value of an instant query; None for no series or NaN."""
        try:
            response = self._client.get(f"{self.url}/api/v1/query", params={"query": expr})
            payload = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusError(f"query {expr!r} against {self.url}: {exc}") from exc
        if payload.get("status") != "success":
            raise PrometheusError(f"query {expr!r}: {payload.get('errorType')}: {payload.get('error')}")
        result = payload["data"]["result"]
        if not result:
            return None
        if len(result) > 1:
            log.warning("query %r returned %d series; using the largest", expr, len(result))
        values = [float(series["value"][1]) for series in result]
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else None

    def read(self) -> Signals:
        q = self.queries
        return Signals(
            ttft_p95_s=self.query_scalar(q.latency_p95("dspark_time_to_first_token_seconds")),
            tpot_p95_s=self.query_scalar(q.latency_p95("dspark_time_per_output_token_seconds")),
            prefill_waiting=self.query_scalar(q.waiting("prefill")),
            decode_waiting=self.query_scalar(q.waiting("decode")),
            prefill_kv_usage=self.query_scalar(q.kv_usage("prefill")),
            decode_kv_usage=self.query_scalar(q.kv_usage("decode")),
        )
