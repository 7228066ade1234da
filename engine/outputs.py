"""What the engine hands back: one `RequestOutput` per request per step that produced
something, and a final one with `finished=True`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob) alternatives, best first


@dataclass(frozen=True)
class RequestTimings:
    arrival_s: float  # time.perf_counter() clock of the engine process
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None


@dataclass(frozen=True)
class SpecStats:
    verify_steps: int = 0  # target verify forwards
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: tuple[int, ...]  # produced since the previous output of this request
    new_text: str  # detokenised delta (stop strings already cut)
    # Every token generated, on the output that ends the request's life in this engine (it
    # finished, or was handed off: finish_reason set); () on the others, whose tokens are their
    # new_token_ids: a stream would otherwise copy and send its whole output again every step.
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None = None  # the stop string or token id that matched
    error: str | None = None
    new_logprobs: tuple[TokenLogprob, ...] = ()
    # With SamplingParams.prompt_logprobs, once, on the first output after they are all
    # computed (the one with the first token): entry i scores prompt token i + 1 under the
    # model at position i; the first prompt token has no entry. None on every other output.
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    timings: RequestTimings | None = None
    spec: SpecStats = field(default_factory=SpecStats)


@dataclass(frozen=True)
class Completion:
    """A whole generation, as the offline `LLM` returns it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None
    stop_reason: str | int | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # as in RequestOutput
    num_cached_tokens: int = 0
    timings: RequestTimings | None = None
    spec: SpecStats = field(default_factory=SpecStats)
