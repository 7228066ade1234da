"""Requests and tokens per minute per caller, as token buckets (docs/design.md §6.8).

A caller is an API key (by its position in --api-keys: no key is kept or logged here) or,
without --api-keys, a client address. Each caller has a request bucket and a token bucket,
each holding up to a minute's allowance and refilled continuously.

A request takes one request and needs a token bucket that is not in debt. Tokens are charged
as they become known: the prompt tokens of every choice once the request is admitted, the
completion tokens when it ends. A request may so overdraw the bucket by its own size (which
--max-tokens-per-request bounds); the caller then waits until the debt is refilled. Refusals
are OpenAI's 429: `type` "requests" or "tokens", code `rate_limit_exceeded`, `Retry-After`
in whole seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.gateway.errors import RateLimited

MAX_IDLE_CALLERS = 10_000  # past this many buckets, the full ones are dropped (a full bucket is a new one)


@dataclass
class TokenBucket:
    capacity: float  # a minute's allowance
    level: float
    updated_s: float  # monotonic

    @property
    def refill_per_s(self) -> float:
        return self.capacity / 60.0

    def refill(self, now_s: float) -> None:
        self.level = min(self.capacity, self.level + (now_s - self.updated_s) * self.refill_per_s)
        self.updated_s = now_s

    def wait_s(self, needed: float) -> int:
        """Whole seconds until the bucket holds `needed` (at least 1)."""
        return max(1, math.ceil((needed - self.level) / self.refill_per_s))

    @property
    def full(self) -> bool:
        return self.level >= self.capacity


@dataclass
class _Caller:
    requests: TokenBucket | None
    tokens: TokenBucket | None


class RateLimiter:
    def __init__(self, rpm: int, tpm: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self.clock = clock
        self._callers: dict[str, _Caller] = {}

    @property
    def enabled(self) -> bool:
        return self.rpm > 0 or self.tpm > 0

    def admit(self, caller: str) -> Callable[[int], None]:
        """Take one request of `caller`'s allowance (429 if none is left, or its tokens are
        in debt); returns what charges the request's tokens to the caller."""
        if not self.enabled:
            return _ignore
        now = self.clock()
        state = self._state(caller, now)
        requests, tokens = state.requests, state.tokens
        if requests is not None:
            requests.refill(now)
            if requests.level < 1.0:
                raise RateLimited(
                    "requests",
                    f"Rate limit reached on requests per min (RPM): Limit {self.rpm}. "
                    f"Please try again in {requests.wait_s(1.0)}s.",
                    requests.wait_s(1.0),
                )
        if tokens is not None:
            tokens.refill(now)
            if tokens.level <= 0.0:
                raise RateLimited(
                    "tokens",
                    f"Rate limit reached on tokens per min (TPM): Limit {self.tpm}, "
                    f"Used {self.tpm - math.floor(tokens.level)}. Please try again in {tokens.wait_s(1.0)}s.",
                    tokens.wait_s(1.0),
                )
        if requests is not None:
            requests.level -= 1.0
        if tokens is None:
            return _ignore

        def charge(num_tokens: int) -> None:
            tokens.refill(self.clock())
            tokens.level -= num_tokens

        return charge

    def _state(self, caller: str, now: float) -> _Caller:
        state = self._callers.get(caller)
        if state is None:
            if len(self._callers) >= MAX_IDLE_CALLERS:
                self._forget_full(now)
            state = _Caller(
                TokenBucket(self.rpm, self.rpm, now) if self.rpm > 0 else None,
                TokenBucket(self.tpm, self.tpm, now) if self.tpm > 0 else None,
            )
            self._callers[caller] = state
        return state

    def _forget_full(self, now: float) -> None:
        for caller, state in list(self._callers.items()):
            buckets = [b for b in (state.requests, state.tokens) if b is not None]
            for bucket in buckets:
                bucket.refill(now)
            if all(b.full for b in buckets):
                del self._callers[caller]


def _ignore(num_tokens: int) -> None:
    return None
