"""What crosses the boundary between a worker and the gateway (Ray method arguments and
return values). Frozen dataclasses, pickled by Ray."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.core import EngineStats
from engine.handoff import Continuation
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from services.workers.transfer import TransferTicket

Role = Literal["prefill", "decode", "worker"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "worker")  # "worker" = colocated


@dataclass(frozen=True)
class WorkerInfo:
    """Static facts about a worker, fixed for the life of one worker process."""

    replica_id: str
    role: Role
    instance_id: str  # new on every (re)start of the process: detects restarts
    model_name: str
    max_model_len: int
    max_num_seqs: int
    eos_token_ids: tuple[int, ...]
    speculative: bool
    kv_transfer: str  # name of the KVTransfer implementation this worker uses
    host: str = ""  # hostname of the worker's node: the pod name under Kubernetes


@dataclass(frozen=True)
class Submission:
    """A request for a worker's engine (its `add_request`), one argument of the Ray call:
    Ray serialises each argument of a call on its own, which costs 0.2-0.3 ms more on
    the way to the worker for the six separate values (docs/results/ttft-hops-cpu.md)."""

    consumer: str
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prefill_only: bool = False
    continuation: Continuation | None = None


@dataclass(frozen=True)
class WorkerEvent:
    """One engine output for one consumer (gateway). `ticket` is set on a prefill worker's
    hand-off output: the decode worker fetches the request's KV with it."""

    output: RequestOutput
    ticket: TransferTicket | None = None


@dataclass(frozen=True)
class PollResult:
    instance_id: str
    events: tuple[WorkerEvent, ...]


@dataclass(frozen=True)
class Ack:
    """Answer to a command. `error` is the engine's "field: message" for input it refused
    (`kind="invalid"`), or why the command could not run (`kind="failed"`)."""

    ok: bool
    error: str | None = None
    kind: Literal["ok", "invalid", "failed"] = "ok"
    elapsed_s: float = 0.0  # worker-side time the command took (KV fetch + copy for receive_kv)
    nbytes: int = 0

    @staticmethod
    def success(elapsed_s: float = 0.0, nbytes: int = 0) -> Ack:
        return Ack(ok=True, elapsed_s=elapsed_s, nbytes=nbytes)

    @staticmethod
    def invalid(message: str) -> Ack:
        return Ack(ok=False, error=message, kind="invalid")

    @staticmethod
    def failed(message: str) -> Ack:
        return Ack(ok=False, error=message, kind="failed")


@dataclass(frozen=True)
class StatsSnapshot:
    """The engine's `EngineStats` plus the worker's own identity, taken on the step thread."""

    instance_id: str
    engine: EngineStats
    num_consumers: int
    step_loop_alive: bool
    draining: bool = False  # takes no new requests: gateways route none to it (drain())
    num_held: int = 0  # requests the worker holds in any state; 0 once a drained worker is empty


def _last_output(request_id: str, finish_reason: str, error: str | None = None) -> RequestOutput:
    """A request's last output that carries no tokens: it ends outside the engine's steps."""
    return RequestOutput(
        request_id=request_id,
        new_token_ids=(),
        new_text="",
        token_ids=(),
        finished=True,
        finish_reason=finish_reason,
        error=error,
    )


def error_output(request_id: str, message: str) -> RequestOutput:
    """The last output of a request that failed before or between the engine's outputs."""
    return _last_output(request_id, "error", message)


def moved_output(request_id: str) -> RequestOutput:
    """The last output of a request its worker gives back to be moved (a drain's end): the
    gateway continues it elsewhere after the tokens it has (docs/design.md §5.6)."""
    return _last_output(request_id, "migrate")


def failed(out: RequestOutput, message: str) -> RequestOutput:
    """`out` turned into its request's last output, failed with `message`."""
    return dataclasses.replace(out, finished=True, finish_reason="error", error=message)


def not_finished(out: RequestOutput) -> RequestOutput:
    """`out` without its finish (a hand-off's first token: the request goes on elsewhere)."""
    return dataclasses.replace(out, finished=False, finish_reason=None)
