"""EngineCore: one `step()` = schedule, launch, then finish the previous step.

The core orchestrates and owns no one's state: the scheduler decides and keeps the request
bookkeeping (`Scheduler.update_from_output`), the runner launches, the output processor turns
tokens into deltas. Step N is launched before the host waits for step N-1's output copy
(the one-step lag of engine/scheduler.py), so the device never idles while the host
detokenises, checks stop conditions and schedules. The offline `LLM` and the Ray workers
drive this same loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.engine_setup import EngineParts, build_engine_parts
from engine.handoff import Continuation, HeldKV, KVHandoff
from engine.kv.pool import KVPool
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.request import Request, token_ids_in_range
from engine.runner.step_output import PendingStep
from engine.sampling.rng import request_key
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledStep
from engine.structured.compiler import GrammarCompiler, GrammarError
from engine.structured.matcher import RequestGrammar
from engine.sync_guard import SyncGuard


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage_ratio: float
    kv_used_slots: int
    kv_total_slots: int
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_cache_hits_total: int
    prefix_cache_queries_total: int
    spec_draft_tokens_total: int
    spec_accepted_tokens_total: int
    spec_verify_steps_total: int
    spec_accept_length_counts: tuple[int, ...]  # [n] = verifies that committed n tokens
    spec_accepted_per_position: tuple[int, ...]  # [i] = verifies whose draft i was accepted
    num_preemptions: int
    steps_total: int
    spec_undrafted_tokens_total: int = 0  # DSpark decode tokens of steps over the batch cap
    prefill_tokens_computed_total: int = 0  # fill positions launched (prefix-cache hits excluded)
    mixed_steps_total: int = 0  # steps that carried decode rows and prefill chunks together


class EngineCore:
    def __init__(self, config: EngineConfig | None = None, *, parts: EngineParts | None = None) -> None:
        self.config = config or EngineConfig()
        self.parts = parts or build_engine_parts(self.config)
        self.tokenizer = self.parts.tokenizer
        self.model_config = self.parts.model_config
        self.model_name = self.parts.model_name
        self.max_model_len = self.parts.max_model_len
        self.scheduler = self.parts.scheduler
        self.kv = self.parts.kv
        self.runner = self.parts.runner
        self.requests: dict[str, Request] = {}
        self._inflight: tuple[ScheduledStep, PendingStep] | None = None
        self._aborts: list[str] = []
        self._handoffs: deque[tuple[Request, KVHandoff]] = deque()
        self._held: dict[str, tuple[Request, float]] = {}  # hold_kv: request, monotonic deadline
        self._key_counter = itertools.count(1)
        self._outputs = OutputProcessor(self.tokenizer, self.model_config, self.max_model_len)
        self._grammar_compiler: GrammarCompiler | None = None  # made at the first grammar request
        self._permit_wait: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.steps_total = 0
        self.prefill_tokens_computed_total = 0
        self.mixed_steps_total = 0

    def attach_sync_guard(self, guard: SyncGuard) -> None:
        """Run under `guard` (docs/design.md §4): the step's wait on the previous output copy is
        the one permitted host/device synchronisation; anything else fails."""
        self._permit_wait = lambda: guard.permitted("previous step output")

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_s: float | None = None,
        *,
        prefill_only: bool = False,
        continuation: Continuation | None = None,
    ) -> None:
        """Queue a request. Raises ValueError naming the bad field; nothing is queued then.
        With `continuation`, the request resumes after tokens generated elsewhere, with their
        sampling key (docs/design.md §5.6)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id: must be a non-empty string")
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params: must be SamplingParams, got {type(params).__name__}")
        prompt = self._validate_prompt(prompt_token_ids, params)
        params.check_vocab(self.model_config.vocab_size)
        start = continuation or Continuation()
        outputs = self._validate_continuation(start, prompt, params)
        req = Request(
            request_id=request_id,
            prompt_ids=prompt,
            params=params,
            arrival_s=time.perf_counter() if arrival_s is None else arrival_s,
            rng_key=self._rng_key(params) if start.rng_key is None else start.rng_key,
            prefill_only=prefill_only,
            grammar=self._grammar(params, tuple(outputs)),
        )
        req.output_ids = outputs
        self._outputs.attach(req)
        self.requests[request_id] = req
        self.scheduler.add(req)

    def _validate_prompt(self, prompt_token_ids: object, params: SamplingParams) -> list[int]:
        if not isinstance(prompt_token_ids, (list, tuple)) or not prompt_token_ids:
            raise ValueError("prompt: must be a non-empty list of token ids")
        vocab = self.model_config.vocab_size
        if not token_ids_in_range(prompt_token_ids, vocab):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        n = len(prompt_token_ids)
        if n + 1 > self.max_model_len:
            raise ValueError(
                f"prompt: {n} tokens leave no room to generate within the context length of {self.max_model_len} tokens"
            )
        return list(prompt_token_ids)

    def _validate_continuation(self, start: Continuation, prompt: list[int], params: SamplingParams) -> list[int]:
        if not isinstance(start, Continuation):
            raise ValueError(f"continuation: must be a Continuation, got {type(start).__name__}")
        outputs = list(start.output_ids)
        if not outputs:
            return outputs
        vocab = self.model_config.vocab_size
        if not token_ids_in_range(outputs, vocab):
            raise ValueError(f"continuation: output token ids must be integers in [0, {vocab})")
        if len(outputs) >= params.max_tokens:
            raise ValueError(f"continuation: {len(outputs)} tokens already reach max_tokens={params.max_tokens}")
        if len(prompt) + len(outputs) + 1 > self.max_model_len:
            raise ValueError("continuation: prompt and output tokens leave no room within the context length")
        return outputs

    def _grammar(self, params: SamplingParams, output_ids: tuple[int, ...]) -> RequestGrammar | None:
        """The request's grammar state after `output_ids` (a hand-off's tokens so far); a
        ValueError names the field when the grammar does not compile or the tokens break it."""
        if params.grammar is None:
            return None
        if self._grammar_compiler is None:
            hf_tokenizer = getattr(self.tokenizer, "hf_tokenizer", None)
            if hf_tokenizer is None:
                raise ValueError("grammar: structured output needs a Hugging Face tokenizer")
            self._grammar_compiler = GrammarCompiler(
                hf_tokenizer, self.model_config.vocab_size, self._outputs.eos_token_ids
            )
        try:
            grammar = RequestGrammar(self._grammar_compiler.compile(params.grammar))
        except GrammarError as exc:
            raise ValueError(f"grammar: {exc}") from None
        for token in output_ids:
            if not grammar.accept(token):
                raise ValueError(f"handoff: output token {token} breaks the request's grammar")
        if not grammar.is_terminated and not grammar.has_next_token(self.model_config.vocab_size):
            raise ValueError("grammar: no token of the model's vocabulary can continue it")
        return grammar

    def _rng_key(self, params: SamplingParams) -> int:
        return request_key(params.seed, self.config.seed, next(self._key_counter))

    def add_prefill_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_s: float | None = None
    ) -> None:
        """Disaggregated prefill: compute the prompt and sample the first token, then stop.
        step() reports it with finish_reason "handoff"; then `export_kv` or `release_handoff`."""
        self.add_request(request_id, prompt_token_ids, params, arrival_s, prefill_only=True)

    def export_kv(self, request_id: str) -> KVHandoff:
        """The handed-off request's KV and state; frees it here (its prefix stays cached)."""
        req = self._handoff_ready(request_id)
        handoff = self._handoff_state(req).with_kv(*self.runner.export_kv(req))
        self._drop_handoff(req)
        return handoff

    def hold_kv(self, request_id: str, hold_s: float) -> HeldKV:
        """The handed-off request's state and slots, for a receiver that copies the KV straight
        out of this engine's pools (docs/design.md §5.7). The request leaves the engine, but
        its slots stay allocated until `release_held`, or for at most `hold_s` seconds
        (`release_expired_holds`). Its prompt and first token already sit in them: they were
        written in the step whose sampled token the host has read."""
        req = self._handoff_ready(request_id)
        held = self._handoff_state(req)
        self._outputs.discard(req)
        self.requests.pop(request_id)
        self._held[request_id] = (req, time.monotonic() + hold_s)
        return held

    def _handoff_state(self, req: Request) -> HeldKV:
        return HeldKV(
            request_id=req.request_id,
            prompt_ids=tuple(req.prompt_ids),
            output_ids=tuple(req.output_ids),
            # the prompt logprobs left with the first token: the decode engine owes none
            params=dataclasses.replace(req.params, prompt_logprobs=None),
            rng_key=req.rng_key,
            kv_len=req.kv_len,
            slots=self.runner.req_to_token_host_slots(req, 0, req.kv_len).copy(),
            arrival_s=req.arrival_s,
            num_cached_tokens=req.prompt_cache_hit,
        )

    def release_held(self, request_id: str) -> None:
        """Free the slots of a request given out by `hold_kv` (its receiver has copied them)."""
        entry = self._held.pop(request_id, None)
        if entry is not None:
            self.scheduler.release(entry[0])

    def release_expired_holds(self) -> list[str]:
        """Free the holds whose time is up (a receiver that never came); their ids."""
        now = time.monotonic()
        expired = [rid for rid, (_, deadline) in self._held.items() if deadline <= now]
        for rid in expired:
            self.release_held(rid)
        return expired

    @property
    def num_held(self) -> int:
        return len(self._held)

    def kv_pools(self) -> tuple[KVPool, KVPool | None]:
        """The device KV pools: target, and DSpark's draft pool (same slot ids) or None."""
        return self.runner.kv_pool, None if self.runner.dspark is None else self.runner.dspark.draft_pool

    def release_handoff(self, request_id: str) -> None:
        """Free a prefilled request that will not be exported (its transfer failed)."""
        req = self.requests.get(request_id)
        if req is not None and req.prefill_only:
            self._drop_handoff(req)

    def _handoff_ready(self, request_id: str) -> Request:
        req = self.requests.get(request_id)
        if req is None or not req.prefill_only or req.finish_reason != "handoff" or req.inflight_steps:
            raise ValueError(f"request_id: {request_id!r} has no completed prefill to hand off")
        return req

    def _drop_handoff(self, req: Request) -> None:
        self._outputs.discard(req)
        self._release(req)

    def add_decode_request(self, request_id: str, handoff: KVHandoff) -> None:
        """Continue a request prefilled elsewhere: it waits for slots, receives the KV, and
        decodes from its last token."""
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        if handoff.kv_len + 1 != len(handoff.prompt_ids) + len(handoff.output_ids):
            raise ValueError("handoff: kv_len must cover every token but the last")
        req = Request(
            request_id=request_id,
            prompt_ids=list(handoff.prompt_ids),
            params=handoff.params,
            arrival_s=handoff.arrival_s,
            rng_key=handoff.rng_key,
            grammar=self._grammar(handoff.params, handoff.output_ids),
        )
        req.output_ids = list(handoff.output_ids)
        req.prompt_cache_hit = handoff.num_cached_tokens
        self._outputs.attach(req)
        self.requests[request_id] = req
        self._handoffs.append((req, handoff))

    def _admit_handoffs(self) -> None:
        while self._handoffs:
            req, handoff = self._handoffs[0]
            if req.abort_requested or req.is_finished:
                self._handoffs.popleft()
                continue
            start = self.scheduler.admit_decoding(req, handoff.kv_len)
            if start is None:
                return  # no memory yet: retry next step
            self._handoffs.popleft()
            self.runner.admit(req)
            self.runner.import_kv(req, handoff.target_kv, handoff.draft_kv, start, req.output_ids[-1])

    def abort_request(self, request_id: str) -> None:
        """Abort at any time; a final output with finish_reason "abort" follows."""
        if request_id in self.requests:
            self._aborts.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or self._inflight is not None

    # -- the loop -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs = self._apply_aborts()
        self._admit_handoffs()
        step = self.scheduler.schedule()
        launched = None
        if step is not None:
            self._admit_new_rows(step)
            launched = (step, self._launch(step))
            self.steps_total += 1
            self.mixed_steps_total += step.kind == "mixed"
        if self._inflight is not None:
            outputs.extend(self._finish_step(*self._inflight))
        self._inflight = launched
        return outputs

    def _launch(self, step: ScheduledStep) -> PendingStep:
        return self.runner.launch(step)

    def _admit_new_rows(self, step: ScheduledStep) -> None:
        for chunk in step.chunks:
            if chunk.admits:
                self.runner.admit(chunk.req)
                self.prompt_tokens_total += len(chunk.req.fill_ids) - chunk.start
        self.prefill_tokens_computed_total += step.num_tokens

    def _finish_step(self, step: ScheduledStep, pending: PendingStep) -> list[RequestOutput]:
        """Wait for the step's outputs, let the scheduler account for them, publish the new
        tokens and release the requests they finished."""
        with self._permit_wait():
            result = pending.wait()
        if result.prompt_logprob is not None:  # before the tokens: they go out with the first one
            self._outputs.append_prompt_logprobs(step.chunks, result)
        outputs: list[RequestOutput] = []
        for req, row, num_tokens in self.scheduler.update_from_output(step, result):
            before = len(req.output_ids)
            out = self._outputs.append_tokens(req, result, row, num_tokens)
            self.generation_tokens_total += len(req.output_ids) - before
            if req.is_finished:
                self._release(req)
            if out is not None:
                outputs.append(out)
        return outputs

    def _apply_aborts(self) -> list[RequestOutput]:
        outputs = []
        for request_id in self._aborts:
            req = self.requests.get(request_id)
            if req is None or req.is_finished:
                continue
            req.abort_requested = True
            self._outputs.finish(req, "abort")
            self._release(req)
            outputs.append(self._outputs.final(req))
        self._aborts.clear()
        return outputs

    def _release(self, req: Request) -> None:
        self.scheduler.release(req)
        self.requests.pop(req.request_id, None)

    # -- introspection --------------------------------------------------------------------

    def stats(self) -> EngineStats:
        usage = self.kv.usage()
        spec = self.scheduler.spec_counters
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_usage_ratio=usage.ratio,
            kv_used_slots=usage.used_slots,
            kv_total_slots=usage.total_slots,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_hits_total=self.kv.prefix_hits_total,
            prefix_cache_queries_total=self.kv.prefix_queries_total,
            spec_draft_tokens_total=spec.draft_tokens,
            spec_accepted_tokens_total=spec.accepted_tokens,
            spec_verify_steps_total=spec.verify_steps,
            spec_accept_length_counts=tuple(spec.accept_length_counts),
            spec_accepted_per_position=tuple(spec.accepted_per_position),
            num_preemptions=self.scheduler.num_preemptions,
            steps_total=self.steps_total,
            spec_undrafted_tokens_total=spec.undrafted_tokens,
            prefill_tokens_computed_total=self.prefill_tokens_computed_total,
            mixed_steps_total=self.mixed_steps_total,
        )

    def run_until_idle(self) -> Iterator[RequestOutput]:
        while self.has_unfinished_requests():
            yield from self.step()
