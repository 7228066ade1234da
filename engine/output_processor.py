"""Turns committed tokens into what callers see: text deltas, stop conditions, logprobs.

Pure host work on the previous step's output copy; runs while the device computes the
next step. A DSpark step commits up to W tokens at once: they are walked one by one so
that a stop condition inside the block truncates exactly where plain decoding would stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.config import ModelConfig
from engine.detokenizer import IncrementalDetokenizer, StopStringMatcher, TokenDecoder
from engine.outputs import RequestOutput, RequestTimings, SpecStats, TokenLogprob
from engine.request import Request, RequestStatus
from engine.runner.step_output import StepResult
from engine.scheduler import PrefillChunk

_PROMPT_CONTEXT_TOKENS = 5


@dataclass
class _Stream:
    detok: IncrementalDetokenizer
    stops: StopStringMatcher
    new_ids: list[int] = field(default_factory=list)
    new_text: list[str] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs_sent: bool = False


class OutputProcessor:
    def __init__(self, tokenizer: TokenDecoder, model_config: ModelConfig, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        eos = set(model_config.eos_token_ids)
        eos.update(getattr(tokenizer, "eos_token_ids", ()))
        self.eos_token_ids = frozenset(eos)
        self._streams: dict[str, _Stream] = {}

    def attach(self, req: Request) -> None:
        """Start the request's text stream. Tokens it already has were shown elsewhere (a
        handed-off request's first token, a continued request's output, docs/design.md §5.6):
        they run through the detokenizer and the stop-string matcher as they did where they
        were generated, emitting nothing, so that text held back there (a space that may
        prefix a cleanup, a possible stop string) is held here too and goes out with the
        next token."""
        params = req.params
        stream = _Stream(
            detok=IncrementalDetokenizer(
                self.tokenizer, req.prompt_ids[-_PROMPT_CONTEXT_TOKENS:], params.skip_special_tokens
            ),
            stops=StopStringMatcher(params.stop, params.include_stop_str_in_output),
        )
        for token in req.output_ids:
            stream.stops.feed(stream.detok.push([token]))
        self._streams[req.request_id] = stream

    def append_tokens(self, req: Request, result: StepResult, row: int, count: int) -> RequestOutput | None:
        """Commit up to `count` tokens of `result` row `row` to `req`, stopping early where a
        stop condition hits. Returns the delta to publish, or None if there is none. A
        prefill-only request that did not finish is marked for handoff."""
        stream = self._streams[req.request_id]
        params = req.params
        if params.max_tokens == 0:  # a scoring request: the prompt is computed, nothing generated
            self.finish(req, "length", flush_text=False)
            return self._delta(req)
        now = time.perf_counter()
        for j in range(count):
            token = int(result.tokens[row, j])
            req.output_ids.append(token)
            stream.new_ids.append(token)
            if req.first_token_s is None:
                req.first_token_s = now
            if params.logprobs is not None and result.logprob is not None:
                stream.new_logprobs.append(self._logprob(result, row, j, params.logprobs))
            if req.grammar is not None and not req.grammar.accept(token):
                # the device sampled under this grammar's mask: a refusal is an engine bug
                self.finish(req, "error", error=f"token {token} breaks the request's grammar")
                break
            n_out = len(req.output_ids)
            if n_out >= params.min_tokens and (
                token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids)
            ):
                self.finish(req, "stop", token)
                break
            emit, matched = stream.stops.feed(stream.detok.push([token]))
            stream.new_text.append(emit)
            if matched is not None:
                self.finish(req, "stop", matched)
                break
            if n_out >= params.max_tokens or len(req.prompt_ids) + n_out >= self.max_model_len:
                self.finish(req, "length")
                break
        if req.prefill_only and not req.is_finished:
            req.finish_reason = "handoff"  # held-back text goes out from the decode engine
        return self._delta(req)

    def append_prompt_logprobs(self, chunks: list[PrefillChunk], result: StepResult) -> None:
        """Collect the prompt logprobs of a prefill step (`PromptLogprobs`' layout). They depend
        on the prompt alone, so they are kept even when the request was preempted since the
        launch; an entry is taken only for the next position missing, so a recompute adds none
        twice."""
        assert result.prompt_logprob is not None
        assert result.prompt_top_ids is not None and result.prompt_top_logprobs is not None
        row = 0
        for chunk in chunks:
            targets = chunk.prompt_targets
            req = chunk.req
            top_n = req.params.prompt_logprobs or 0
            for j, position in enumerate(targets):
                if req.is_finished or position != len(req.prompt_logprobs) + 1:
                    continue
                top = tuple(
                    (int(t), float(lp))
                    for t, lp in zip(
                        result.prompt_top_ids[row + j, :top_n], result.prompt_top_logprobs[row + j, :top_n], strict=True
                    )
                )
                req.prompt_logprobs.append(
                    TokenLogprob(req.prompt_ids[position], float(result.prompt_logprob[row + j]), top)
                )
            row += len(targets)

    @staticmethod
    def _logprob(result: StepResult, row: int, col: int, top_n: int) -> TokenLogprob:
        assert result.logprob is not None
        top: tuple[tuple[int, float], ...] = ()
        if top_n and result.top_ids is not None and result.top_logprobs is not None:
            top = tuple(
                (int(t), float(lp))
                for t, lp in zip(result.top_ids[row, col, :top_n], result.top_logprobs[row, col, :top_n], strict=True)
            )
        return TokenLogprob(int(result.tokens[row, col]), float(result.logprob[row, col]), top)

    def finish(
        self,
        req: Request,
        reason: str,
        stop_reason: str | int | None = None,
        error: str | None = None,
        *,
        flush_text: bool = True,
    ) -> None:
        """Finish `req`; held-back text goes out unless `flush_text` is False (a request that
        generated nothing, whose detokenizer holds only prompt context)."""
        req.finish_reason = reason
        req.stop_reason = stop_reason
        req.error = error
        req.status = RequestStatus.FINISHED
        req.finished_s = time.perf_counter()
        stream = self._streams[req.request_id]
        if flush_text and (reason != "stop" or isinstance(stop_reason, int)):
            emit, _ = stream.stops.feed(stream.detok.flush())
            stream.new_text.append(emit + stream.stops.flush())

    def discard(self, req: Request) -> None:
        self._streams.pop(req.request_id, None)

    def final(self, req: Request) -> RequestOutput:
        out = self._delta(req, force=True)
        assert out is not None
        return out

    def _delta(self, req: Request, force: bool = False) -> RequestOutput | None:
        stream = self._streams[req.request_id]
        text = "".join(stream.new_text)
        if not (force or req.is_finished or stream.new_ids or text):
            return None
        prompt_logprobs = None
        if req.params.prompt_logprobs is not None and not stream.prompt_logprobs_sent and not req.scores_prompt:
            prompt_logprobs = tuple(req.prompt_logprobs)
            stream.prompt_logprobs_sent = True
        out = RequestOutput(
            request_id=req.request_id,
            new_token_ids=tuple(stream.new_ids),
            new_text=text,
            token_ids=tuple(req.output_ids) if req.finish_reason is not None else (),
            finished=req.is_finished,
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            error=req.error,
            new_logprobs=tuple(stream.new_logprobs),
            prompt_logprobs=prompt_logprobs,
            num_prompt_tokens=len(req.prompt_ids),
            num_cached_tokens=req.prompt_cache_hit,
            timings=RequestTimings(req.arrival_s, req.first_scheduled_s, req.first_token_s, req.finished_s),
            spec=SpecStats(req.verify_steps, req.draft_tokens, req.accepted_tokens),
        )
        stream.new_ids, stream.new_text, stream.new_logprobs = [], [], []
        if req.is_finished:
            del self._streams[req.request_id]
        return out
