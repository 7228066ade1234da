"""An EngineCore driven by a background step thread, with a thread-safe command interface.

The engine is not thread-safe, so every engine call (add, abort, step, export) runs on the
one step thread: callers enqueue commands, which the thread runs before its next step. An
abort therefore reaches the engine before the next step starts ("within one step").
Outputs go to per-consumer buffers (`Outbox`) that the gateway drains with long polls.

Prefill workers take a request's KV out of the engine as soon as it reports its hand-off
(exported, or held in place for a device transport: `HandoffSender`) and publish the ticket
after the first token. Decode workers receive through `receive_kv`, which fetches the KV off
the step thread and then installs it on the step thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.handoff import Continuation, KVHandoff
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from services.waits import within
from services.workers.handoff_sender import HandoffSender, Taken
from services.workers.outbox import Outbox
from services.workers.pending import pending_handoffs
from services.workers.transfer import KVTransfer, TransferError, TransferTicket
from services.workers.types import (
    Ack,
    PollResult,
    Role,
    StatsSnapshot,
    WorkerEvent,
    WorkerInfo,
    error_output,
    failed,
    moved_output,
    not_finished,
)

if TYPE_CHECKING:
    from engine.core import EngineCore

logger = logging.getLogger(__name__)

HANDOFF = "handoff"


class EngineLoop:
    def __init__(
        self,
        engine: EngineCore,
        *,
        role: Role,
        replica_id: str,
        transfer: KVTransfer,
        max_num_seqs: int,
        speculative: bool,
        consumer_lease_s: float = 30.0,
        idle_wait_s: float = 0.05,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.role = role
        self.transfer = transfer
        self.instance_id = uuid.uuid4().hex
        self.info = WorkerInfo(
            replica_id=replica_id,
            role=role,
            instance_id=self.instance_id,
            model_name=engine.model_name,
            max_model_len=engine.max_model_len,
            max_num_seqs=max_num_seqs,
            eos_token_ids=tuple(getattr(engine.tokenizer, "eos_token_ids", ())),
            speculative=speculative,
            kv_transfer=transfer.name,
            host=socket.gethostname(),
        )
        self._consumer_lease_s = consumer_lease_s
        self._idle_wait_s = idle_wait_s
        self._on_fatal = on_fatal
        self.outbox = Outbox()
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # request id -> consumer, for requests the engine holds (step thread only)
        self._owner: dict[str, str] = {}
        # hand-offs being fetched by receive_kv: request id -> consumer; aborted ones
        self._receive_lock = threading.Lock()
        self._receiving: dict[str, str] = {}
        self._receive_cancelled: set[str] = set()
        self.fatal_error: BaseException | None = None
        self.draining = False
        self._stats = StatsSnapshot(self.instance_id, engine.stats(), 0, True)
        self._stats_every_s = 0.02
        self._last_stats_s = 0.0
        self._sender = HandoffSender(engine, transfer, self.outbox, self._submit, replica_id)
        self._thread = threading.Thread(target=self._run, name=f"engine-loop-{replica_id}", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._sender.shutdown()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.fatal_error is None

    def drain(self) -> None:
        """Take no new requests from now on and finish the ones held. The flag travels in the
        stats, from which every gateway's pool stops routing here; requests a gateway already
        routed here are still served. There is no way back: a drained worker is removed."""
        self.draining = True
        self._last_stats_s = 0.0
        self._wake.set()

    def evict(self) -> None:
        """Give every held request back to its gateway, to move to another worker as a
        continuation (docs/design.md §5.6): each gets a last output with finish_reason
        "migrate", and the engine drops it. The end of a drain's grace."""
        self._submit(self._do_evict)

    # -- thread-safe commands ---------------------------------------------------------------

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    def add_request(
        self,
        consumer: str,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        prefill_only: bool = False,
        arrival_s: float | None = None,
        continuation: Continuation | None = None,
    ) -> concurrent.futures.Future[Ack]:
        future: concurrent.futures.Future[Ack] = concurrent.futures.Future()
        if self.fatal_error is not None:
            future.set_result(Ack.failed(f"worker engine failed: {self.fatal_error}"))
            return future
        arrival = time.perf_counter() if arrival_s is None else arrival_s
        prompt = list(prompt_token_ids)
        self.outbox.touch(consumer)
        self._submit(
            lambda: self._do_add(future, consumer, request_id, prompt, params, prefill_only, arrival, continuation)
        )
        return future

    def abort(self, request_ids: Sequence[str]) -> None:
        ids = list(request_ids)
        with self._receive_lock:
            for rid in ids:
                if rid in self._receiving:
                    self._receive_cancelled.add(rid)
        self._submit(lambda: self._do_abort(ids))

    def release_kv(self, request_ids: Sequence[str]) -> None:
        """Receivers copied these held requests' KV: free their slots (device hand-off)."""
        ids = list(request_ids)
        self._submit(lambda: self._sender.release(ids))

    async def receive_kv(self, consumer: str, request_id: str, ticket: TransferTicket, timeout_s: float) -> Ack:
        """Fetch a hand-off and install it in the engine; the decode continues on this worker."""
        start = time.perf_counter()
        if self.fatal_error is not None:
            self.transfer.discard(ticket)
            return Ack.failed(f"worker engine failed: {self.fatal_error}")
        self.outbox.touch(consumer)
        with self._receive_lock:
            self._receiving[request_id] = consumer
        try:
            # the transport bounds its own wait; this bound holds whatever the transport does
            handoff = await within(self.transfer.receive(ticket, timeout_s), timeout_s + 1.0)
        except Exception as exc:  # any failure of the transport fails the request, never hangs it
            with self._receive_lock:
                self._receiving.pop(request_id, None)
                self._receive_cancelled.discard(request_id)
            self.transfer.discard(ticket)
            if isinstance(exc, asyncio.TimeoutError):
                message = f"KV transfer timed out after {timeout_s:g} s"
            elif isinstance(exc, TransferError):
                message = str(exc)
            else:
                message = f"KV transfer failed: {type(exc).__name__}: {exc}"
            logger.warning("request %s: KV receive failed: %s", request_id, message)
            return Ack.failed(message)
        future: concurrent.futures.Future[Ack] = concurrent.futures.Future()
        self._submit(lambda: self._do_add_decode(future, consumer, request_id, handoff))
        ack = await asyncio.wrap_future(future)
        return dataclasses.replace(ack, elapsed_s=time.perf_counter() - start, nbytes=ticket.nbytes)

    async def poll(self, consumer: str, timeout_s: float) -> PollResult:
        events = await self.outbox.take(consumer, timeout_s)
        return PollResult(self.instance_id, tuple(events))

    def stats(self) -> StatsSnapshot:
        return self._stats

    # -- step thread ------------------------------------------------------------------------

    def _run(self) -> None:
        last_lease_check = time.monotonic()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self._drain_commands()
                self._sender.sweep()
                now = time.monotonic()
                if now - last_lease_check > 1.0:
                    last_lease_check = now
                    self._expire_consumers()
                if self.engine.has_unfinished_requests():
                    self._publish(self.engine.step())
                    self._snapshot_stats()
                else:
                    self._snapshot_stats(force=True)
                    self._wake.wait(self._idle_wait_s)
        except BaseException as exc:  # the engine's state is unknown now: fail everything
            logger.exception("engine step loop of %s failed", self.info.replica_id)
            self.fatal_error = exc
            self._fail_all(f"worker engine failed: {type(exc).__name__}: {exc}")
            self._stats = dataclasses.replace(self._stats, step_loop_alive=False)
            if self._on_fatal is not None:
                self._on_fatal(exc)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    def _snapshot_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_stats_s >= self._stats_every_s:
            self._last_stats_s = now
            stats = self.engine.stats()
            with self._receive_lock:
                receiving = len(self._receiving)
            pending = pending_handoffs(self.role, stats, len(self.engine.requests), receiving)
            if pending:
                stats = dataclasses.replace(stats, num_waiting=stats.num_waiting + pending)
            held = len(self.engine.requests) + receiving
            self._stats = StatsSnapshot(self.instance_id, stats, self.outbox.num_consumers(), True, self.draining, held)

    def _do_add(
        self,
        future: concurrent.futures.Future[Ack],
        consumer: str,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        prefill_only: bool,
        arrival_s: float,
        continuation: Continuation | None,
    ) -> None:
        if request_id in self._owner:
            future.set_result(Ack.invalid(f"request_id: {request_id!r} is already running"))
            return
        self._admit(
            future,
            consumer,
            request_id,
            lambda: self.engine.add_request(
                request_id,
                prompt,
                params,
                arrival_s,
                prefill_only=prefill_only,
                continuation=continuation,
            ),
        )

    def _do_add_decode(
        self, future: concurrent.futures.Future[Ack], consumer: str, request_id: str, handoff: KVHandoff
    ) -> None:
        with self._receive_lock:
            self._receiving.pop(request_id, None)
            cancelled = request_id in self._receive_cancelled
            self._receive_cancelled.discard(request_id)
        if cancelled:
            future.set_result(Ack.failed("request was aborted during the KV transfer"))
            return
        self._admit(future, consumer, request_id, lambda: self.engine.add_decode_request(request_id, handoff))

    def _admit(
        self,
        future: concurrent.futures.Future[Ack],
        consumer: str,
        request_id: str,
        add: Callable[[], None],
    ) -> None:
        """Hand a request to the engine (`add`) and answer `future`: invalid for input the
        engine refuses (ValueError), failed for any other error."""
        try:
            add()
        except ValueError as exc:
            future.set_result(Ack.invalid(str(exc)))
            return
        except Exception as exc:
            logger.exception("request %s: adding it to the engine failed", request_id)
            future.set_result(Ack.failed(f"{type(exc).__name__}: {exc}"))
            return
        self._owner[request_id] = consumer
        future.set_result(Ack.success())

    def _do_abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if rid in self._owner:
                self.engine.abort_request(rid)

    def _expire_consumers(self) -> None:
        """A consumer (gateway) that stopped polling is gone: abort what it left behind."""
        for consumer in self.outbox.idle_consumers(self._consumer_lease_s):
            orphans = [rid for rid, owner in self._owner.items() if owner == consumer]
            if orphans:
                logger.warning("consumer %s stopped polling; aborting %d requests", consumer, len(orphans))
            for rid in orphans:
                self.engine.abort_request(rid)
            if not orphans:
                self.outbox.drop(consumer)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        by_consumer: dict[str, list[WorkerEvent]] = defaultdict(list)
        handoffs: list[tuple[str, RequestOutput, Taken]] = []
        for out in outputs:
            consumer = self._owner.get(out.request_id)
            if consumer is None:
                continue
            if out.finish_reason == HANDOFF:
                del self._owner[out.request_id]
                taken = self._sender.take(out)
                if taken is None:
                    by_consumer[consumer].append(WorkerEvent(failed(out, "KV export failed")))
                    continue
                # the first token goes out now; the ticket follows once the KV is sent
                by_consumer[consumer].append(WorkerEvent(not_finished(out)))
                handoffs.append((consumer, out, taken))
            else:
                by_consumer[consumer].append(WorkerEvent(out))
                if out.finished:
                    del self._owner[out.request_id]
        self.outbox.put_many(by_consumer)
        for consumer, out, taken in handoffs:  # after the tokens: a consumer sees them first
            self._sender.submit(consumer, out, taken)

    def _do_evict(self) -> None:
        if self._owner:
            logger.info("handing %d requests back to their gateways to move elsewhere", len(self._owner))
        for rid in self._owner:
            self.engine.abort_request(rid)
        self._end_held(moved_output)

    def _fail_all(self, message: str) -> None:
        self._end_held(lambda rid: error_output(rid, message))

    def _end_held(self, last_output: Callable[[str], RequestOutput]) -> None:
        """Publish `last_output(request_id)` for every held request and forget them here."""
        by_consumer: dict[str, list[WorkerEvent]] = defaultdict(list)
        for rid, consumer in self._owner.items():
            by_consumer[consumer].append(WorkerEvent(last_output(rid)))
        self._owner.clear()
        self.outbox.put_many(by_consumer)
