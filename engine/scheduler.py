"""Continuous batching: which requests run in the next step, and how much of each.

A step carries decode rows (every decodable request advances by one token, or by one DSpark
draft+verify block) and prefill chunks (pieces of prompts; the last chunk of a request
samples its next token), all under one token budget. Two policies (EngineConfig.scheduling):

- "mixed" (vLLM v1, Sarathi-Serve): every step schedules the decode rows first, then fills
  what is left of the budget with chunks, so a decode row never waits for a chunk step;
- "alternating": a step is either chunks or decode rows, taking turns when both are
  pending, so a long prompt delays running requests by at most one chunk step.

Requests admitted while another request is computing the same prefix wait for its pages
(engine/kv/shared_prefix.py) instead of computing it again.

The one-step lag (docs/design.md §4), stated here once: step N is launched before the host has
seen step N-1's outputs, so the scheduler works on host state that lags the device by one
step. It knows exactly what it scheduled, and what came out of every step but the one in
flight. Tokens per decode step are at most `step_width` (1, or W = gamma + 1 with DSpark), so
a request's KV length is bounded by `kv_ub = kv_len + inflight_steps * step_width`; the
scheduler raises the bound when it schedules a step and `update_from_output` brings it back
to the exact length when the step's outputs arrive. Hence `kv_reserve`: a request that
reaches the scheduler holds slots for its committed KV plus two windows, the step in flight
and the one being scheduled.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from engine.config import SchedulingPolicyName
from engine.kv.manager import KVManager
from engine.kv.shared_prefix import computing_elsewhere
from engine.request import Request, RequestStatus
from engine.runner.step_output import StepResult
from engine.speculative.stats import SpecCounters

_LAG_WINDOWS = 2  # the step in flight and the one being scheduled


def kv_reserve(kv_len: int, step_width: int) -> int:
    """Positions a request with `kv_len` committed positions must hold slots for."""
    return kv_len + _LAG_WINDOWS * step_width


def longest_kv_within(context: int, step_width: int) -> int:
    """The longest committed KV whose `kv_reserve` fits in `context` positions."""
    return context - _LAG_WINDOWS * step_width


@dataclass(frozen=True)
class PrefillChunk:
    req: Request
    start: int  # first fill position of this chunk
    end: int  # one past the last
    samples: bool  # the chunk ends the fill: its last logits sample the next token
    scores_prompt: bool = False  # the chunk computes the logprobs of its prompt targets
    admits: bool = False  # the first chunk of this admission: the runner stages the row

    @property
    def prompt_targets(self) -> range:
        """Prompt positions t whose logprob this chunk computes, each from the logits at t - 1:
        [start + 1, min(end, P - 1)] for a prompt of P tokens (the next chunk's first token
        included, the token sampled after the prompt not)."""
        if not self.scores_prompt:
            return range(0)
        return range(self.start + 1, min(self.end, len(self.req.prompt_ids) - 1) + 1)


@dataclass
class ScheduledStep:
    """One forward's work. Its output rows are the decode rows first, then the chunks, in
    the order of `requests`; a "mixed" step has both, the others one kind."""

    kind: Literal["prefill", "decode", "mixed"]
    chunks: list[PrefillChunk] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)  # per row of `requests`, at launch
    kv_before: list[int] = field(default_factory=list)  # per decode row: KV-length bound before the step

    @property
    def requests(self) -> list[Request]:
        return self.decode + [c.req for c in self.chunks]

    @property
    def num_tokens(self) -> int:  # prefill tokens (decode rows not counted)
        return sum(c.end - c.start for c in self.chunks)


class CommittedRow(NamedTuple):
    """A row of a step's outputs whose tokens go to its request."""

    req: Request
    row: int  # row of the step's StepResult
    num_tokens: int  # tokens the row committed (StepResult.accept_len[row])


class Scheduler:
    def __init__(
        self,
        kv: KVManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
        max_model_len: int,
        step_width: int,
        spec_gamma: int | None = None,
        policy: SchedulingPolicyName = "alternating",
    ) -> None:
        """`spec_gamma`: DSpark's drafts per verify (then step_width = gamma + 1); None: off."""
        self.policy = policy
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.max_model_len = max_model_len
        self.step_width = step_width
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.decoding: list[Request] = []
        self._last_kind: str = "decode"
        self.num_preemptions = 0
        self.speculative = spec_gamma is not None
        self.spec_counters = SpecCounters(spec_gamma or 0)

    # -- queue management -------------------------------------------------------------

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Drop `req` from whichever queue holds it (requests compare by identity)."""
        for queue in (self.decoding, self.prefilling, self.waiting):
            if req in queue:
                queue.remove(req)
                return

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def release(self, req: Request) -> None:
        """Finish `req` and free everything it holds. Safe while a launched step still uses
        its slots: device work runs in launch order, before any later owner's writes."""
        req.status = RequestStatus.FINISHED
        req.finished_s = req.finished_s or time.perf_counter()
        self.remove(req)
        self.kv.release(req, req.all_ids, req.kv_len)

    # -- the decision -----------------------------------------------------------------

    def schedule(self) -> ScheduledStep | None:
        step = self._choose_mixed() if self.policy == "mixed" else self._choose_alternating()
        if step is not None:
            now = time.perf_counter()
            for req in step.requests:
                if req.first_scheduled_s is None:
                    req.first_scheduled_s = now
        return step

    def _choose_mixed(self) -> ScheduledStep | None:
        """Decode rows first (they take `step_width` tokens of the budget each), then chunks
        in what is left. Decode rows reserve their slots before any admission, so a prompt
        never takes the memory a running request needs to advance."""
        decode = self._schedule_decode()
        num_decode = len(decode.decode) if decode is not None else 0
        budget = self.token_budget - num_decode * self.step_width
        prefill = self._schedule_prefill(budget) if budget > 0 and (self.prefilling or self.waiting) else None
        if decode is None or prefill is None:
            return decode or prefill
        return ScheduledStep(
            "mixed",
            chunks=prefill.chunks,
            decode=decode.decode,
            epochs=decode.epochs + prefill.epochs,
            kv_before=decode.kv_before,
        )

    def _choose_alternating(self) -> ScheduledStep | None:
        decodable = [r for r in self.decoding if self._wants_decode(r)]
        prefill_pending = bool(self.prefilling or self.waiting)
        prefer_prefill = prefill_pending and (not decodable or self._last_kind == "decode")
        if prefer_prefill:
            step = self._schedule_prefill()
            if step is not None:
                self._last_kind = "prefill"
                return step
        if decodable:
            step = self._schedule_decode()
            if step is not None:
                self._last_kind = "decode"
                return step
        if prefill_pending and not prefer_prefill:
            step = self._schedule_prefill()
            if step is not None:
                self._last_kind = "prefill"
                return step
        return None

    def _wants_decode(self, req: Request) -> bool:
        """False when the tokens already generated or in flight reach a limit, for
        prefill-only requests (disaggregated prefill hands them off instead), and for a
        grammar-constrained request whose last token the host has not seen yet: its next
        mask depends on that token, so it skips a step (docs/design.md §2.8)."""
        produced_lower_bound = len(req.output_ids) + req.inflight_steps
        return (
            not req.prefill_only
            and produced_lower_bound < req.params.max_tokens
            and self._kv_upper_bound(req) + 1 <= self.max_model_len
            and (req.grammar is None or req.inflight_steps == 0)
        )

    def _kv_upper_bound(self, req: Request) -> int:
        return req.kv_ub

    def _schedule_decode(self) -> ScheduledStep | None:
        chosen: list[Request] = []
        for req in list(self.decoding):
            if req.status is not RequestStatus.DECODING or not self._wants_decode(req):
                continue
            # Positions this step may write: [kv_ub, kv_ub + W) (docs/design.md §3).
            need = self._kv_upper_bound(req) + self.step_width
            while not self.kv.reserve(req, need):
                victim = self._youngest_decoding(exclude=chosen)
                if victim is None:
                    break
                self.preempt(victim)
                if victim is req:
                    break
            if req.status is RequestStatus.DECODING and req.num_allocated >= need:
                chosen.append(req)
        if not chosen:
            return None
        kv_before = [r.kv_ub for r in chosen]
        for req in chosen:
            req.inflight_steps += 1
            req.kv_ub += self.step_width
        return ScheduledStep("decode", decode=chosen, epochs=[r.epoch for r in chosen], kv_before=kv_before)

    def _youngest_decoding(self, exclude: list[Request]) -> Request | None:
        for req in reversed(self.decoding):
            if req not in exclude:
                return req
        return None

    def preempt(self, req: Request) -> None:
        """Recompute preemption: drop the request's KV (the prefix cache may keep it) and
        queue it first; results of its in-flight step are discarded by the epoch check."""
        self.kv.release(req, req.all_ids, req.kv_len)
        self.decoding.remove(req)
        req.status = RequestStatus.WAITING
        req.epoch += 1
        req.inflight_steps = 0
        req.kv_len = req.kv_ub = 0
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _schedule_prefill(self, budget: int | None = None) -> ScheduledStep | None:
        """Chunks of `budget` tokens at most (None: the token budget), prefilling requests
        first. A queued request whose prefix another is still computing keeps its place in
        the queue until those pages are cached; later ones may pass it meanwhile."""
        budget = self.token_budget if budget is None else budget
        chunks: list[PrefillChunk] = []
        for req in self.prefilling:
            if budget <= 0:
                break
            chunk = self._chunk(req, budget, first=not chunks)
            if chunk is None:
                break
            chunks.append(chunk)
            budget -= chunk.end - chunk.start
        deferred: list[Request] = []
        while self.waiting and budget > 0 and self.num_running < self.max_num_seqs:
            req = self.waiting[0]
            if not req.scores_prompt and computing_elsewhere(self.kv, req.all_ids, self.prefilling):
                deferred.append(self.waiting.popleft())
                continue
            if not self._admit(req):
                break
            self.waiting.popleft()
            self.prefilling.append(req)
            chunk = self._chunk(req, budget, first=not chunks, admits=True)
            if chunk is None:
                break
            chunks.append(chunk)
            budget -= chunk.end - chunk.start
        self.waiting.extendleft(reversed(deferred))
        if not chunks:
            return None
        for chunk in chunks:
            req = chunk.req
            req.num_computed = chunk.end
            # Launched KV is as good as computed for any later step (device work runs in
            # order): its whole pages go to the prefix cache now, for others to attach to.
            self.kv.share_computed(req, req.fill_ids, chunk.end)
            if chunk.samples:
                req.kv_ub = chunk.end
                req.inflight_steps += 1
                self._start_decoding(req)
        return ScheduledStep("prefill", chunks=chunks, epochs=[c.req.epoch for c in chunks])

    def _admit(self, req: Request) -> bool:
        fill = req.all_ids
        reserve_to = kv_reserve(len(fill), self.step_width)
        # cached positions have KV but no logits: a request scoring its prompt computes it all
        admitted = self.kv.can_admit(reserve_to) and self.kv.admit(
            req, fill, reserve_to, use_prefix_cache=not req.scores_prompt
        )
        if not admitted:
            return False
        req.fill_ids = fill
        if req.preemptions == 0:
            req.prompt_cache_hit = req.num_cached
        req.num_computed = req.num_cached
        req.kv_len = req.num_cached
        req.kv_ub = req.num_cached
        req.status = RequestStatus.PREFILLING
        return True

    def _chunk(self, req: Request, budget: int, first: bool, admits: bool = False) -> PrefillChunk | None:
        remaining = len(req.fill_ids) - req.num_computed
        if remaining <= budget:
            take = remaining
        elif self.chunked_prefill:
            take = budget
        elif first:
            take = remaining  # an unchunked prompt longer than the budget runs alone
        else:
            return None
        start = req.num_computed
        end = start + take
        samples = end == len(req.fill_ids)
        return PrefillChunk(req, start, end, samples=samples, scores_prompt=req.scores_prompt, admits=admits)

    def admit_decoding(self, req: Request, kv_len: int) -> int | None:
        """Admit a request whose KV for positions [0, kv_len) arrives from elsewhere; it
        decodes from the next step. Returns the first position to copy in (positions below
        it came from the prefix cache), or None when memory or rows are short."""
        if self.num_running >= self.max_num_seqs:
            return None
        fill = req.all_ids
        reserve_to = kv_reserve(kv_len, self.step_width)
        if not self.kv.can_admit(reserve_to) or not self.kv.admit(req, fill, reserve_to):
            return None
        req.kv_len = req.kv_ub = kv_len
        req.num_computed = len(fill)
        req.status = RequestStatus.DECODING
        self.decoding.append(req)
        return req.num_cached

    def _start_decoding(self, req: Request) -> None:
        """The request's fill has been launched in full; it decodes from the next step."""
        if req in self.prefilling:
            self.prefilling.remove(req)
            req.status = RequestStatus.DECODING
            self.decoding.append(req)

    # -- after a step -----------------------------------------------------------------

    def update_from_output(self, step: ScheduledStep, result: StepResult) -> list[CommittedRow]:
        """Bring each request of `step` up to date with the step's outputs: the step is no
        longer in flight, the KV length is exact again, and DSpark's counters count the
        verify. Returns the rows whose tokens go to their requests; rows of requests that
        finished or were preempted since the launch, and of prefill chunks that did not
        sample, are skipped."""
        committed: list[CommittedRow] = []
        num_decode = len(step.decode)
        for i, req in enumerate(step.requests):
            if req.is_finished or req.epoch != step.epochs[i]:
                continue
            is_decode = i < num_decode
            if not is_decode and not step.chunks[i - num_decode].samples:
                continue
            count = int(result.accept_len[i])
            req.inflight_steps -= 1
            req.kv_len = int(result.kv_len[i])
            req.kv_ub = req.kv_len + req.inflight_steps * self.step_width
            if is_decode and result.draft_len is not None:
                drafted = int(result.draft_len[i])
                req.verify_steps += 1
                req.draft_tokens += drafted
                req.accepted_tokens += count - 1
                self.spec_counters.record(count)
            elif is_decode and self.speculative:
                self.spec_counters.record_undrafted()
            committed.append(CommittedRow(req, i, count))
        return committed
