"""The prefill side of a KV hand-off (docs/design.md §5, §5.7): take a prefilled request out
of the engine as soon as it reports its hand-off, make its KV reachable through the
`KVTransfer`, and publish the ticket to the request's consumer after its first token.

Two forms, by transport: exported tensors (`EngineCore.export_kv`, then `send`, e.g. a
`ray.put` of tens of MB, on a sender thread off the step thread), or slots held in place
(`EngineCore.hold_kv`, then `send_held`) until the receiver reports its copy done
(`release`) or the hold times out (`sweep`). Engine calls run on the step thread only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.handoff import HeldKV, KVHandoff
from engine.outputs import RequestOutput
from services.workers.outbox import Outbox
from services.workers.transfer import KVTransfer
from services.workers.types import WorkerEvent, failed

if TYPE_CHECKING:
    from engine.core import EngineCore

logger = logging.getLogger(__name__)

Taken = KVHandoff | HeldKV


class HandoffSender:
    def __init__(
        self,
        engine: EngineCore,
        transfer: KVTransfer,
        outbox: Outbox,
        submit: Callable[[Callable[[], None]], None],
        replica_id: str,
    ) -> None:
        self.engine = engine
        self.transfer = transfer
        self.outbox = outbox
        self._submit = submit  # runs a command on the step thread
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"kv-send-{replica_id}")

    def take(self, out: RequestOutput) -> Taken | None:
        """Step thread: the request's KV out of the engine (exported, or held in place); None,
        with the slots released, if that fails."""
        try:
            if self.transfer.holds_slots:
                return self.engine.hold_kv(out.request_id, self.transfer.hold_s)
            return self.engine.export_kv(out.request_id)
        except Exception:
            logger.exception("request %s: taking its KV for the hand-off failed", out.request_id)
            try:
                self.engine.release_handoff(out.request_id)
            except Exception:
                logger.exception("request %s: release_handoff failed", out.request_id)
            return None

    def submit(self, consumer: str, out: RequestOutput, taken: Taken) -> None:
        """Send on the sender thread; the ticket (or the failure) goes to `consumer`."""
        self._executor.submit(self._send, consumer, out, taken)

    def release(self, request_ids: list[str]) -> None:
        """Step thread: receivers copied these held requests' KV."""
        for rid in request_ids:
            self.engine.release_held(rid)

    def sweep(self) -> None:
        """Step thread: free holds no receiver came for in time."""
        if self.engine.num_held:
            for rid in self.engine.release_expired_holds():
                logger.warning(
                    "request %s: no receiver copied its KV within %g s; slots freed", rid, self.transfer.hold_s
                )

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _send(self, consumer: str, out: RequestOutput, taken: Taken) -> None:
        marker = dataclasses.replace(out, new_token_ids=(), new_text="", new_logprobs=(), prompt_logprobs=None)
        try:
            if isinstance(taken, HeldKV):
                ticket = self.transfer.send_held(out.request_id, taken, taken.kv_len * self._slot_bytes())
            else:
                ticket = self.transfer.send(out.request_id, taken)
            event = WorkerEvent(marker, ticket)
        except Exception as exc:
            logger.exception("request %s: KV send failed", out.request_id)
            if isinstance(taken, HeldKV):  # an exported request's slots are already free
                self._submit(lambda: self.engine.release_held(out.request_id))
            event = WorkerEvent(failed(marker, f"KV transfer failed: {exc}"))
        self.outbox.put_many({consumer: [event]})

    def _slot_bytes(self) -> int:
        target, draft = self.engine.kv_pools()
        return target.slot_bytes + (0 if draft is None else draft.slot_bytes)
