"""Running one HTTP generation request: submit its choices, then stream (SSE) or collect.

`start` submits every choice (or none); `respond` streams or collects the outputs. A client
that disconnects cancels the stream (or the collection); the choices are then aborted on
their workers, which drop them before their next step. A stream whose body never started
(the client left between submission and the first byte) is ended by the response's
background task instead, so no choice outlives its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask
from starlette.requests import Request

from engine.outputs import RequestOutput
from services.gateway.deadlines import Deadlines, next_output
from services.gateway.dispatcher import Dispatcher
from services.gateway.errors import APIError, InternalError
from services.gateway.preprocess import Job
from services.gateway.responses import ChoiceState, Formatter, Usage
from services.gateway.sse import sse_comment
from services.gateway.streaming import DisconnectAwareStreamingResponse, wait_for_disconnect
from services.gateway.telemetry import CLIENT_CLOSED, InflightRequest, RequestMetrics, RequestTimer
from services.gateway.tracked import Sink, Tracked
from services.gateway.wire_format import WireFormat

logger = logging.getLogger(__name__)


def _no_charge(num_tokens: int) -> None:
    return None


@dataclass(frozen=True)
class Generation:
    response_id: str
    model: str
    jobs: list[Job]
    num_prompts: int
    stream: bool
    formatter: Formatter
    timer: RequestTimer
    wire: WireFormat = field(default_factory=WireFormat)  # the API shape the bodies are sent in
    # the caller's token allowance (rate_limit.py): charged the prompt tokens of every choice
    # once they all run, and the completion tokens when the request ends
    charge_tokens: Callable[[int], None] = _no_charge


@dataclass(frozen=True)
class Started:
    """A generation whose choices all run on workers."""

    gen: Generation
    tracked: list[Tracked]
    sink: Sink


def new_response_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def worker_error(message: str) -> APIError:
    return InternalError(f"The request failed on a worker: {message}", code="worker_error")


def failure_of(tracked: list[Tracked], index: int, out: RequestOutput) -> APIError:
    """The error a client gets for a choice that ended in error: the gateway's own reason
    where it ended the request itself (Tracked.failure), else the worker's."""
    reason = next((t.failure for t in tracked if t.index == index and t.failure is not None), None)
    return reason or worker_error(out.error or "aborted by the worker")


class GenerationRunner:
    def __init__(
        self,
        dispatcher: Dispatcher,
        metrics: RequestMetrics,
        *,
        request_timeout_s: float | None = None,
        queue_timeout_s: float | None = None,
        keepalive_s: float = 15.0,
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.queue_timeout_s = queue_timeout_s
        self.keepalive_s = keepalive_s

    def _deadlines(self, gen: Generation) -> Deadlines:
        return Deadlines(gen.timer.arrival_s, self.request_timeout_s, self.queue_timeout_s, self.keepalive_s)

    async def start(self, gen: Generation) -> Started:
        sink: Sink = asyncio.Queue()
        submissions = [
            (f"{gen.response_id}-{job.index}", job.index, job.prompt_token_ids, job.params) for job in gen.jobs
        ]
        # a refusal here (400/429/503) propagates, and so does a cancellation (the client left):
        # either way no choice is left on a worker; the app counts the refusal with its status
        tracked = await self.dispatcher.submit_all(submissions, sink, gen.timer.arrival_s)
        gen.charge_tokens(sum(len(job.prompt_token_ids) for job in gen.jobs))
        return Started(gen, tracked, sink)

    async def respond(self, started: Started, http_request: Request) -> Response:
        gen = started.gen
        inflight = self.metrics.inflight(gen.model)
        headers = {"X-Request-Id": gen.response_id}
        if gen.stream:
            return self._stream_response(started, inflight, headers)
        return await self._collect(started, http_request, headers, inflight)

    # -- shared -----------------------------------------------------------------------------

    def _usage(self, gen: Generation, tracked: Sequence[Tracked], states: Sequence[ChoiceState]) -> Usage:
        n = len(gen.jobs) // max(1, gen.num_prompts)
        firsts = [t for t in tracked if t.index % n == 0]
        return Usage(
            prompt_tokens=sum(t.num_prompt_tokens for t in firsts),
            completion_tokens=sum(len(s.token_ids) for s in states),
            cached_tokens=sum(t.num_cached_tokens for t in firsts),
        )

    def _finish_metrics(
        self,
        gen: Generation,
        tracked: Sequence[Tracked],
        states: Sequence[ChoiceState],
        status: int,
        inflight: InflightRequest,
    ) -> None:
        inflight.ended()
        try:
            usage = self._usage(gen, tracked, states)
            gen.charge_tokens(usage.completion_tokens)
            self.metrics.finished(
                gen.model,
                gen.timer,
                tracked,
                status,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                max_choice_tokens=max((len(s.token_ids) for s in states), default=0),
            )
        except Exception:
            logger.exception("recording metrics of %s failed", gen.response_id)

    # -- streaming --------------------------------------------------------------------------

    def _stream_response(self, started: Started, inflight: InflightRequest, headers: dict[str, str]) -> Response:
        gen, tracked = started.gen, started.tracked
        states = [ChoiceState() for _ in gen.jobs]
        ended = False

        def end(status: int) -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            if status != 200:
                for t in tracked:
                    self.dispatcher.abort(t)
            self._finish_metrics(gen, tracked, states, status, inflight)

        async def end_if_never_started() -> None:
            end(CLIENT_CLOSED)

        return DisconnectAwareStreamingResponse(
            self._stream(started, states, inflight, end),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(end_if_never_started),
        )

    async def _stream(
        self, started: Started, states: list[ChoiceState], inflight: InflightRequest, end: Callable[[int], None]
    ) -> AsyncIterator[bytes]:
        gen, sink = started.gen, started.sink
        fmt, wire = gen.formatter, gen.wire
        remaining = len(gen.jobs)
        status = CLIENT_CLOSED  # unless the stream completes or fails
        try:
            yield wire.opening()
            for index in range(len(gen.jobs)):
                opening = fmt.opening_chunk(index)
                if opening is not None:
                    yield wire.chunk(opening)
            deadlines = self._deadlines(gen)
            while remaining:
                try:
                    item = await next_output(sink, deadlines, any(s.token_ids for s in states))
                except APIError as exc:  # a deadline passed: end() aborts the choices
                    status = exc.status
                    yield wire.failure(exc)
                    return
                if item is None:
                    yield sse_comment("keep-alive")
                    continue
                index, out = item
                state = states[index]
                if out.finish_reason in ("error", "abort"):
                    failure = failure_of(started.tracked, index, out)
                    status = failure.status  # the HTTP status was 200 already
                    yield wire.failure(failure)
                    return
                chunk = fmt.delta_chunk(index, out, state)
                state.absorb(out)
                if chunk is not None:
                    yield wire.chunk(chunk)
                    gen.timer.content_sent(state.unsent_tokens)
                    inflight.started()
                    state.unsent_tokens = 0
                if out.finished:
                    remaining -= 1
                    yield wire.chunk(fmt.final_chunk(index, state))
                    if gen.timer.first_content_s is None or state.unsent_tokens:
                        gen.timer.content_sent(state.unsent_tokens)
                        state.unsent_tokens = 0
            usage = self._usage(gen, started.tracked, states)
            if fmt.include_usage:
                yield wire.chunk(fmt.usage_chunk(usage))
            yield wire.closing(usage)
            status = 200
        finally:
            end(status)

    # -- whole responses --------------------------------------------------------------------

    async def _collect(
        self, started: Started, http_request: Request, headers: dict[str, str], inflight: InflightRequest
    ) -> Response:
        gen, tracked, sink = started.gen, started.tracked, started.sink
        states = [ChoiceState() for _ in gen.jobs]

        async def collect() -> None:
            remaining = len(gen.jobs)
            deadlines = self._deadlines(gen)
            while remaining:
                item = await next_output(sink, deadlines, any(s.token_ids for s in states))
                if item is None:
                    continue
                index, out = item
                if out.finish_reason in ("error", "abort"):
                    raise failure_of(tracked, index, out)
                if out.new_token_ids:
                    inflight.started()
                states[index].absorb(out)
                remaining -= out.finished

        collector = asyncio.create_task(collect())
        watcher = asyncio.create_task(wait_for_disconnect(http_request.receive))
        try:
            await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not collector.done():  # the client went away (or we were cancelled)
                collector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await collector
                for t in tracked:
                    self.dispatcher.abort(t)
                self._finish_metrics(gen, tracked, states, CLIENT_CLOSED, inflight)
        if collector.cancelled():
            return Response(status_code=CLIENT_CLOSED)
        error = collector.exception()
        if error is not None:
            for t in tracked:
                self.dispatcher.abort(t)
            if not isinstance(error, APIError):
                logger.error("request %s failed: %r", gen.response_id, error)
                error = InternalError("The server had an error while processing your request.")
            self._finish_metrics(gen, tracked, states, error.status, inflight)
            return error.response()
        usage = self._usage(gen, tracked, states)
        response = JSONResponse(gen.wire.whole(gen.formatter.full(states, usage), usage), headers=headers)
        gen.timer.content_sent(sum(s.unsent_tokens for s in states))
        self._finish_metrics(gen, tracked, states, 200, inflight)
        return response
