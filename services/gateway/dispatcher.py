"""The life of an engine request at the gateway: route, submit, follow, hand off, move, finish.

Colocated: one worker runs the request and streams its outputs.
Disaggregated: the prefill worker runs the prompt and publishes the first token together
with a transfer ticket; the dispatcher streams that token to the client at once and asks
the decode worker to receive the KV (`receive_kv`), after which the decode worker streams
the rest. A request whose worker dies (or drains it) moves to another as a continuation of
the tokens the client has (docs/design.md §5.6), up to `migration_limit` times; past that, or
with nowhere to go, it ends with an error output (finish_reason "error"): a request never
waits on a worker that cannot answer.

Outputs reach the HTTP layer through a per-HTTP-request queue (`sink`) of
`(choice index, RequestOutput)`; the last item of every engine request is a finished output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from services.gateway.errors import APIError, InternalError, Overloaded, ServiceUnavailable, field_error
from services.gateway.pool import Replica, WorkerPool
from services.gateway.tracked import Sink, Tracked, new_rng_key
from services.router import AtCapacity, NoReplicas, Router
from services.workers.client import WorkerUnavailable
from services.workers.transfer import TransferTicket
from services.workers.types import WorkerEvent, error_output, not_finished

logger = logging.getLogger(__name__)

MigrationReason = Literal["worker_down", "drain"]


class Dispatcher:
    def __init__(
        self,
        pool: WorkerPool,
        router: Router,
        *,
        add_timeout_s: float = 60.0,
        kv_transfer_timeout_s: float = 30.0,
        retry_after_s: int = 1,
        migration_limit: int = 3,
        on_migration: Callable[[Tracked, MigrationReason], None] | None = None,
    ) -> None:
        self.pool = pool
        self.router = router
        self.add_timeout_s = add_timeout_s
        self.kv_transfer_timeout_s = kv_transfer_timeout_s
        self.retry_after_s = retry_after_s
        self.migration_limit = migration_limit
        self.on_migration = on_migration
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
        admitted: bool = False,
    ) -> Tracked:
        """Route and start one engine request; raises an APIError (400/429/503/500) if it cannot.
        `admitted`: a later choice of a request whose first choice started (never a 429)."""
        tracked = Tracked(
            request_id,
            index,
            prompt_token_ids,
            params,
            sink,
            arrival_s,
            num_prompt_tokens=len(prompt_token_ids),
            rng_key=None if params.seed is not None else new_rng_key(),
        )
        self.requests[request_id] = tracked
        error = await self._start(tracked, admitted=admitted)
        if error is not None:
            self._drop(tracked)
            raise error
        return tracked

    async def _start(self, tracked: Tracked, avoid: str = "", admitted: bool = False) -> APIError | None:
        """Route `tracked` (prompt + the tokens it already has) and add it to a worker as a
        continuation, never to `avoid` (the replica it moves off: a draining one may still hold
        it until its abort lands); a worker found down on the way is marked so and another is
        tried. An `admitted` request may fill a replica past its capacity (services/router.py).
        Returns the error that stopped it, or None once a worker holds it."""
        tokens = tracked.prompt_token_ids + tracked.output_ids
        for _ in range(self.migration_limit + 1):
            loads = self.pool.loads()
            if avoid:
                loads = {
                    pool: [dataclasses.replace(r, healthy=False) if r.replica_id == avoid else r for r in replicas]
                    for pool, replicas in loads.items()
                }
            try:
                route = self.router.route(tokens, **loads, admitted=admitted)
            except AtCapacity as exc:
                return Overloaded(f"The server is overloaded ({exc}); retry later.", self.retry_after_s)
            except NoReplicas as exc:
                return ServiceUnavailable(f"No workers available to serve the request ({exc}).")
            disaggregated = route.prefill is not None
            first = route.prefill if route.prefill is not None else route.decode
            tracked.stage = "prefill" if disaggregated else "colocated"
            tracked.replica = first
            tracked.decode_replica = route.decode if disaggregated else None
            tracked.first_role = self.pool.replicas[first].role
            tracked.decode_role = self.pool.replicas[route.decode].role
            self._hold(tracked, first)
            if disaggregated:
                self._hold(tracked, route.decode)
            replica = self.pool.replicas[first]
            tracked.submitted_s = time.perf_counter()
            try:
                ack = await replica.client.add_request(
                    self.pool.consumer_id,
                    tracked.request_id,
                    tracked.prompt_token_ids,
                    tracked.params,
                    disaggregated,
                    self.add_timeout_s,
                    continuation=tracked.continuation(),
                )
            except WorkerUnavailable as exc:
                if tracked.replica != first:
                    # the worker took it before it died, and the request went on without this
                    # answer (its hand-off came, or a migration moved it): starting it again
                    # would run it twice ("already running" on its decode worker)
                    self.pool.mark_down(first, str(exc))
                    return None
                self._release_all(tracked)
                tracked.replica = ""  # marking the replica down must not move this request too
                self.pool.mark_down(first, str(exc))
                continue
            if tracked.done:  # the client left while the worker took it
                if ack.ok:
                    self._send_abort(first, [tracked.request_id])
                return None
            if not ack.ok:
                self._release_all(tracked)
                if ack.kind == "invalid":
                    return field_error(ack.error or "invalid request")
                return InternalError(f"Worker {first} could not start the request: {ack.error}")
            return None
        return ServiceUnavailable("Every worker tried was unavailable; retry the request.")

    async def submit_all(
        self, jobs: Sequence[tuple[str, int, list[int], SamplingParams]], sink: Sink, arrival_s: float
    ) -> list[Tracked]:
        """Start every choice of an HTTP request, or none of them: on a refusal, or when
        cancelled (the client left), what was started is aborted. Capacity is checked for the
        first choice alone: the others follow it even onto full replicas, so a request of
        `n` choices is never refused because of its own earlier choices."""
        started: list[Tracked] = []
        try:
            for request_id, index, prompt, params in jobs:
                started.append(
                    await self._submit_whole(request_id, index, prompt, params, sink, arrival_s, bool(started))
                )
        except BaseException:
            for tracked in started:
                self.abort(tracked)
            raise
        return started

    async def _submit_whole(
        self,
        request_id: str,
        index: int,
        prompt: list[int],
        params: SamplingParams,
        sink: Sink,
        arrival_s: float,
        admitted: bool,
    ) -> Tracked:
        """`submit`, never cut short by a cancellation while a worker may be accepting the
        request: the cancellation is raised at once and the request aborted once accepted."""
        pending = asyncio.ensure_future(self.submit(request_id, index, prompt, params, sink, arrival_s, admitted))
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
                    timings = tracked.worker_timings = out.timings
                    if timings and timings.first_token_s is not None and timings.first_scheduled_s is not None:
                        tracked.prefill_s = max(0.0, timings.first_token_s - timings.first_scheduled_s)
                elif tracked.stage == "transfer" and tracked.decode_start_s is None:
                    tracked.decode_start_s = now
            if event.ticket is not None:
                self._on_handoff(tracked, out, event.ticket, now)
            elif out.finished and out.finish_reason == "migrate":
                self.migrate(tracked, f"worker {replica.replica_id} is draining", "drain", out)
            elif out.finished:
                self._finish(tracked, out)
            else:
                self._pass_on(tracked, out)

    def _pass_on(self, tracked: Tracked, out: RequestOutput) -> None:
        tracked.output_ids.extend(out.new_token_ids)
        tracked.sink.put_nowait((tracked.index, out))

    def _on_handoff(self, tracked: Tracked, out: RequestOutput, ticket: TransferTicket, now: float) -> None:
        # the transfer phase starts at the first token: sending the KV off the prefill
        # worker (which may follow the token in a separate event) is part of it
        tracked.handoff_s = tracked.first_token_s if tracked.first_token_s is not None else now
        if out.new_token_ids or out.new_text:
            self._pass_on(tracked, not_finished(out))
        self._release(tracked, tracked.replica)
        tracked.stage = "transfer"
        self._spawn(self._transfer(tracked, ticket, tracked.replica))

    async def _transfer(self, tracked: Tracked, ticket: TransferTicket, source: str) -> None:
        # aborted between the hand-off and now, or moved off `source` (the prefill worker died
        # after the hand-off, before this ran): the ticket's KV is dropped with it
        if tracked.done or tracked.replica != source:
            return
        target = tracked.decode_replica
        replica = self.pool.replicas.get(target) if target else None
        if replica is None or not replica.healthy:
            if target:
                self._release(tracked, target)
            try:
                target = self.router.pick_decode(self.pool.loads()["decode"], tracked.prompt_token_ids)
            except NoReplicas as exc:
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
            if tracked.replica == replica.replica_id:
                why = f"decode worker {replica.replica_id} failed during the KV transfer: {exc}"
                self.migrate(tracked, why, "worker_down")
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

    def fail(self, tracked: Tracked, message: str, *, abort: bool = True, failure: APIError | None = None) -> None:
        """End the request with an error output; tell the worker holding it to drop it.
        `failure`: the error the client gets, when the gateway's own (default: a worker's)."""
        if tracked.done:
            return
        logger.warning("request %s failed: %s", tracked.request_id, message)
        tracked.failure = failure
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
            self.migrate(tracked, f"worker {replica.replica_id} failed: {why}", "worker_down")

    # -- migration (docs/design.md §5.6) ----------------------------------------------------

    def migrate(self, tracked: Tracked, why: str, reason: MigrationReason, last: RequestOutput | None = None) -> None:
        """Move `tracked` off its replica to a live one, continuing after the tokens the client
        has; `last` is the old replica's final output (a drain's), whose tokens are kept.
        Past `migration_limit` moves the request fails with `why`."""
        if tracked.done:
            return
        if last is not None and (last.new_token_ids or last.new_text):
            self._pass_on(tracked, not_finished(last))
        if tracked.migrations >= self.migration_limit:
            self.fail(tracked, f"{why} (moved {tracked.migrations} times already)", abort=False)
            return
        old = tracked.replica
        tracked.replica = ""  # from here on, outputs from the old replica are dropped
        tracked.migrations += 1
        self._release_all(tracked)
        if old and last is None:
            self._send_abort(old, [tracked.request_id])  # in case it still runs there
        logger.warning("request %s: moving it off %s (%s)", tracked.request_id, old or "its worker", why)
        if self.on_migration is not None:
            self.on_migration(tracked, reason)
        self._spawn(self._restart(tracked, why, old))

    async def _restart(self, tracked: Tracked, why: str, old: str) -> None:
        error = await self._start(tracked, avoid=old, admitted=True)
        if error is not None and not tracked.done:
            self.fail(tracked, f"{why}; it could not be moved: {error.message}", abort=False)

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

    def _release_all(self, tracked: Tracked) -> None:
        for replica_id in list(tracked.holds):
            self._release(tracked, replica_id)

    def _drop(self, tracked: Tracked) -> None:
        tracked.stage = "done"
        self.requests.pop(tracked.request_id, None)
        self._release_all(tracked)
