"""The life of an engine request at the gateway: route, submit, follow, hand off, finish.

Colocated: one worker runs the request and streams its outputs.
Disaggregated: the prefill worker runs the prompt and publishes the first token together
with a transfer ticket; the dispatcher streams that token to the client at once and asks
the decode worker to receive the KV (`receive_kv`), after which the decode worker streams
the rest. A failed or timed-out transfer, or a worker that dies, ends the request with an
error output (finish_reason "error"): a request never waits on a worker that cannot answer.

Outputs reach the HTTP layer through a per-HTTP-request queue (`sink`) of
`(choice index, RequestOutput)`; the last item of every engine request is a finished output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from services.gateway.errors import InternalError, Overloaded, ServiceUnavailable, field_error
from services.gateway.pool import Replica, WorkerPool
from services.router import AtCapacity, NoReplicas, Route, Router
from services.workers.client import WorkerUnavailable
from services.workers.transfer import TransferTicket
from services.workers.types import WorkerEvent, error_output, not_finished

logger = logging.getLogger(__name__)

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
    route: Route
    arrival_s: float  # gateway perf_counter
    stage: Stage = "colocated"
    replica: str = ""  # the replica that holds the request now
    decode_replica: str | None = None
    first_role: str = "worker"  # role of the replica that queued and prefilled it (metric label)
    decode_role: str = "worker"  # role of the replica that decoded it
    holds: list[str] = field(default_factory=list)  # replicas whose inflight count includes it
    # phase boundaries on the gateway clock (perf_counter seconds)
    first_token_s: float | None = None
    handoff_s: float | None = None
    decode_start_s: float | None = None
    last_token_s: float | None = None
    prefill_s: float | None = None  # engine-measured: first scheduled -> first token
    num_cached_tokens: int = 0
    num_prompt_tokens: int = 0
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.stage == "done"


class Dispatcher:
    def __init__(
        self,
        pool: WorkerPool,
        router: Router,
        *,
        add_timeout_s: float = 60.0,
        kv_transfer_timeout_s: float = 30.0,
        retry_after_s: int = 1,
    ) -> None:
        self.pool = pool
        self.router = router
        self.add_timeout_s = add_timeout_s
        self.kv_transfer_timeout_s = kv_transfer_timeout_s
        self.retry_after_s = retry_after_s
        self.requests: dict[str, Tracked] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- submission -------------------------------------------------------------------------

    async def submit(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: Sink,
        arrival_s: float,
    ) -> Tracked:
        """Route and start one engine request; raises an APIError (400/429/503/500) if it cannot."""
        try:
            route = self.router.route(prompt_token_ids, **self.pool.loads())
        except AtCapacity as exc:
            raise Overloaded(f"The server is overloaded ({exc}); retry later.", self.retry_after_s) from None
        except NoReplicas as exc:
            raise ServiceUnavailable(f"No workers available to serve the request ({exc}).") from None
        disaggregated = route.prefill is not None
        first = route.prefill if route.prefill is not None else route.decode
        tracked = Tracked(
            request_id,
            index,
            prompt_token_ids,
            params,
            sink,
            route,
            arrival_s,
            stage="prefill" if disaggregated else "colocated",
            replica=first,
            decode_replica=route.decode if disaggregated else None,
            first_role=self.pool.replicas[first].role,
            decode_role=self.pool.replicas[route.decode].role,
            num_prompt_tokens=len(prompt_token_ids),
        )
        self.requests[request_id] = tracked
        self._hold(tracked, first)
        if disaggregated:
            self._hold(tracked, route.decode)
        replica = self.pool.replicas[first]
        try:
            ack = await replica.client.add_request(
                self.pool.consumer_id, request_id, prompt_token_ids, params, disaggregated, self.add_timeout_s
            )
        except WorkerUnavailable as exc:
            self._drop(tracked)
            self.pool.mark_down(first, str(exc))
            raise ServiceUnavailable(f"Worker {first} is unavailable; retry the request.") from None
        if not ack.ok:
            self._drop(tracked)
            if ack.kind == "invalid":
                raise field_error(ack.error or "invalid request")
            raise InternalError(f"Worker {first} could not start the request: {ack.error}")
        return tracked

    async def submit_all(
        self, jobs: Sequence[tuple[str, int, list[int], SamplingParams]], sink: Sink, arrival_s: float
    ) -> list[Tracked]:
        """Start every choice of an HTTP request, or none of them: on a refusal, or when
        cancelled (the client left), what was started is aborted."""
        started: list[Tracked] = []
        try:
            for request_id, index, prompt, params in jobs:
                started.append(await self._submit_whole(request_id, index, prompt, params, sink, arrival_s))
        except BaseException:
            for tracked in started:
                self.abort(tracked)
            raise
        return started

    async def _submit_whole(
        self, request_id: str, index: int, prompt: list[int], params: SamplingParams, sink: Sink, arrival_s: float
    ) -> Tracked:
        """`submit`, never cut short by a cancellation while a worker may be accepting the
        request: the cancellation is raised at once and the request aborted once accepted."""
        pending = asyncio.ensure_future(self.submit(request_id, index, prompt, params, sink, arrival_s))
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            pending.add_done_callback(self._abort_accepted)
            raise

    def _abort_accepted(self, pending: asyncio.Future[Tracked]) -> None:
        if not pending.cancelled() and pending.exception() is None:
            self.abort(pending.result())

    # -- following --------------------------------------------------------------------------

    def on_events(self, replica: Replica, events: Sequence[WorkerEvent]) -> None:
        now = time.perf_counter()
        for event in events:
            out = event.output
            tracked = self.requests.get(out.request_id)
            if tracked is None or tracked.replica != replica.replica_id:
                # finished, aborted or failed here already; a late ticket is dropped with its KV
                continue
            if out.new_token_ids:
                tracked.last_token_s = now
                if tracked.first_token_s is None:
                    tracked.first_token_s = now
                    tracked.num_cached_tokens = out.num_cached_tokens
                    if out.num_prompt_tokens:
                        tracked.num_prompt_tokens = out.num_prompt_tokens
                    timings = out.timings
                    if timings and timings.first_token_s is not None and timings.first_scheduled_s is not None:
                        tracked.prefill_s = max(0.0, timings.first_token_s - timings.first_scheduled_s)
                elif tracked.stage == "transfer" and tracked.decode_start_s is None:
                    tracked.decode_start_s = now
            if event.ticket is not None:
                self._on_handoff(tracked, out, event.ticket, now)
            elif out.finished:
                self._finish(tracked, out)
            else:
                tracked.sink.put_nowait((tracked.index, out))

    def _on_handoff(self, tracked: Tracked, out: RequestOutput, ticket: TransferTicket, now: float) -> None:
        # the transfer phase starts at the first token: sending the KV off the prefill
        # worker (which may follow the token in a separate event) is part of it
        tracked.handoff_s = tracked.first_token_s if tracked.first_token_s is not None else now
        if out.new_token_ids or out.new_text:
            tracked.sink.put_nowait((tracked.index, not_finished(out)))
        self._release(tracked, tracked.replica)
        tracked.stage = "transfer"
        self._spawn(self._transfer(tracked, ticket))

    async def _transfer(self, tracked: Tracked, ticket: TransferTicket) -> None:
        if tracked.done:  # aborted between the hand-off and now: the ticket's KV is dropped with it
            return
        target = tracked.decode_replica
        replica = self.pool.replicas.get(target) if target else None
        if replica is None or not replica.healthy:
            if target:
                self._release(tracked, target)
            try:
                target = self.router.pick_decode(self.pool.loads()["decode"], tracked.prompt_token_ids)
            except (NoReplicas, AtCapacity) as exc:
                self.fail(tracked, f"no decode worker for the KV hand-off: {exc}")
                return
            self._hold(tracked, target)
            tracked.decode_replica = target
            replica = self.pool.replicas[target]
            tracked.decode_role = replica.role
        tracked.replica = replica.replica_id
        try:
            ack = await replica.client.receive_kv(
                self.pool.consumer_id, tracked.request_id, ticket, self.kv_transfer_timeout_s
            )
        except WorkerUnavailable as exc:
            self.fail(tracked, f"decode worker {replica.replica_id} failed during the KV transfer: {exc}")
            return
        if tracked.done:  # aborted or failed while the KV moved
            if ack.ok:
                self._send_abort(replica.replica_id, [tracked.request_id])
            return
        if not ack.ok:
            logger.warning(
                "request %s: KV transfer to %s failed: %s", tracked.request_id, replica.replica_id, ack.error
            )
            self.fail(tracked, f"KV transfer to {replica.replica_id} failed: {ack.error}", abort=False)
            return
        now = time.perf_counter()
        if tracked.decode_start_s is None:
            tracked.decode_start_s = now
        tracked.stage = "decode"

    def _finish(self, tracked: Tracked, out: RequestOutput) -> None:
        if tracked.done:
            return
        tracked.stage = "done"
        tracked.finish_reason = out.finish_reason
        self.requests.pop(tracked.request_id, None)
        for replica_id in list(tracked.holds):
            self._release(tracked, replica_id)
        tracked.sink.put_nowait((tracked.index, out))

    # -- failure and abort ------------------------------------------------------------------

    def fail(self, tracked: Tracked, message: str, *, abort: bool = True) -> None:
        """End the request with an error output; tell the worker holding it to drop it."""
        if tracked.done:
            return
        logger.warning("request %s failed: %s", tracked.request_id, message)
        if abort:
            self._send_abort(tracked.replica, [tracked.request_id])
        self._finish(tracked, error_output(tracked.request_id, message))

    def abort(self, tracked: Tracked) -> None:
        """The client went away: drop the request on its worker (before the worker's next step)."""
        if tracked.done:
            return
        self._send_abort(tracked.replica, [tracked.request_id])
        tracked.stage = "done"
        tracked.finish_reason = "abort"
        self.requests.pop(tracked.request_id, None)
        for replica_id in list(tracked.holds):
            self._release(tracked, replica_id)

    def on_replica_down(self, replica: Replica, why: str) -> None:
        self.router.forget(replica.replica_id)
        for tracked in [t for t in self.requests.values() if t.replica == replica.replica_id]:
            self.fail(tracked, f"worker {replica.replica_id} failed: {why}", abort=False)

    def _send_abort(self, replica_id: str, request_ids: list[str]) -> None:
        replica = self.pool.replicas.get(replica_id)
        if replica is None or not replica_id:
            return

        async def send() -> None:
            with contextlib.suppress(WorkerUnavailable):
                await replica.client.abort(request_ids)

        self._spawn(send())

    # -- bookkeeping ------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _hold(self, tracked: Tracked, replica_id: str) -> None:
        replica = self.pool.replicas.get(replica_id)
        if replica is not None:
            replica.inflight += 1
            tracked.holds.append(replica_id)

    def _release(self, tracked: Tracked, replica_id: str) -> None:
        if replica_id in tracked.holds:
            tracked.holds.remove(replica_id)
            replica = self.pool.replicas.get(replica_id)
            if replica is not None:
                replica.inflight = max(0, replica.inflight - 1)

    def _drop(self, tracked: Tracked) -> None:
        tracked.stage = "done"
        self.requests.pop(tracked.request_id, None)
        for replica_id in list(tracked.holds):
            self._release(tracked, replica_id)
