"""One engine request (one choice of an HTTP request) as the gateway follows it."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Literal

from engine.handoff import Continuation
from engine.outputs import RequestOutput, RequestTimings
from engine.sampling_params import SamplingParams
from services.gateway.errors import APIError

Stage = Literal["prefill", "transfer", "decode", "colocated", "done"]
Sink = asyncio.Queue[tuple[int, RequestOutput]]


@dataclass
class Tracked:
    """One engine request (one choice of an HTTP request) as the gateway follows it."""

    request_id: str
    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    sink: Sink
    arrival_s: float  # gateway perf_counter
    stage: Stage = "colocated"
    replica: str = ""  # the replica that holds the request now
    decode_replica: str | None = None
    first_role: str = "worker"  # role of the replica that queued and prefilled it (metric label)
    decode_role: str = "worker"  # role of the replica that decoded it
    holds: list[str] = field(default_factory=list)  # replicas whose inflight count includes it
    # phase boundaries on the gateway clock (perf_counter seconds)
    submitted_s: float | None = None  # the add_request call to the worker that prefilled it
    first_token_s: float | None = None
    handoff_s: float | None = None
    decode_start_s: float | None = None
    last_token_s: float | None = None
    prefill_s: float | None = None  # engine-measured: first scheduled -> first token
    # the first token's engine timings (the worker's perf_counter: the gateway's clock on one host)
    worker_timings: RequestTimings | None = None
    num_cached_tokens: int = 0
    num_prompt_tokens: int = 0
    finish_reason: str | None = None
    # why the gateway itself ended the request (a shutdown's grace over); None: the worker's error
    failure: APIError | None = None
    # what a migration continues from (docs/design.md §5.6)
    rng_key: int | None = None  # the gateway's key for an unseeded request; seeded: from its seed
    output_ids: list[int] = field(default_factory=list)  # token ids passed to the client so far
    migrations: int = 0

    @property
    def done(self) -> bool:
        return self.stage == "done"

    def continuation(self) -> Continuation:
        return Continuation(self.rng_key, tuple(self.output_ids))


def new_rng_key() -> int:
    """A fresh signed 64-bit sampling key (engine/sampling/rng.py keys are int64)."""
    return secrets.randbits(64) - (1 << 63)
