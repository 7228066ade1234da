"""Host-side state of one request. The scheduler and the engine core own it; the device
never sees it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.kv.radix import RadixNode
from engine.outputs import TokenLogprob
from engine.sampling_params import SamplingParams
from engine.structured.matcher import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued; holds no slots
    PREFILLING = "prefilling"  # admitted; prompt chunks being computed
    DECODING = "decoding"  # prompt done; generating
    FINISHED = "finished"


@dataclass(eq=False)  # identity: queues find a request by `is`, never by comparing fields
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float
    rng_key: int  # counter-based sampling key (from the seed, or assigned by the engine)
    prefill_only: bool = False  # disaggregated prefill: stop after the first token
    grammar: RequestGrammar | None = None  # structured output: advanced by each committed token

    status: RequestStatus = RequestStatus.WAITING
    fill_ids: list[int] = field(default_factory=list)  # what the current admission prefills
    epoch: int = 0  # bumped on preemption: results of steps launched before are stale
    output_ids: list[int] = field(default_factory=list)  # tokens already handed to the caller side
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1.. so far
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    abort_requested: bool = False

    # KV bookkeeping (host)
    row: int = -1  # row in the req→token table
    num_allocated: int = 0  # positions [0, num_allocated) have slots
    num_cached: int = 0  # leading fill tokens served by the prefix cache (this admission)
    prompt_cache_hit: int = 0  # prompt tokens the prefix cache served at first admission
    prefix_node: RadixNode | None = None  # locked radix node of the cached prefix
    num_computed: int = 0  # fill tokens scheduled for prefill so far
    kv_len: int = 0  # positions with valid KV as of the last processed step (exact)
    kv_ub: int = 0  # upper bound on the KV length once every launched step has run
    inflight_steps: int = 0  # launched token-producing steps not yet processed
    preemptions: int = 0

    # Timings (perf_counter seconds)
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None

    # DSpark per-request stats
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by everything generated: what a recompute must prefill."""
        return self.prompt_ids + self.output_ids

    @property
    def scores_prompt(self) -> bool:
        """Prompt logprobs were asked for and are not all in: its prefill computes them and
        takes nothing from the prefix cache (docs/design.md §2.4)."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids) - 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


def token_ids_in_range(token_ids: list[int] | tuple[int, ...], vocab_size: int) -> bool:
    """Every id a plain int (not bool, not a numpy scalar) in [0, vocab_size). Runs at C speed:
    a turn of a long session resubmits its whole history, thousands of ids per request."""
    return set(map(type, token_ids)) == {int} and min(token_ids) >= 0 and max(token_ids) < vocab_size
