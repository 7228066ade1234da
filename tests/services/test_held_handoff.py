"""The held form of the KV hand-off through the real workers and gateway, in one process: the
prefill worker holds the request's slots (`HandoffSender`), the decode worker copies them out
and reports the copy (`release_kv`), as `CudaIpcTransfer` does between two processes on one
GPU (docs/design.md §5.7). The GPU's memory mapping is the one part that cannot run here:
`HeldInProcessTransfer` reads the producer's pools directly instead, with everything around
it real. Also checked: a ticket that is never claimed frees its slots after the hold, and
`CudaIpcTransfer` refuses tickets it must not read, before touching a GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import openai
import pytest
import torch

from engine.handoff import HeldKV, KVHandoff
from engine.kv.pool import KVPool
from engine.sampling_params import SamplingParams
from services.gateway import GatewayConfig, create_app
from services.gateway.pool import StaticDiscovery
from services.workers.client import LocalWorkerClient
from services.workers.device_transfer import CudaIpcTransfer, DevicePayload, PoolHandles, node_id
from services.workers.engine_loop import EngineLoop
from services.workers.transfer import KVTransfer, ReleaseSink, TransferError, TransferTicket
from tests.services.conftest import MODEL, chat_token_ids, drain, greedy_reference, test_engine_config
from tests.services.serving import serve, wait_ready
from tests.services.stack import FAST_POOL

pytestmark = pytest.mark.timeout(600)
HOLD_S = 4.0


@dataclass(frozen=True)
class LoopReleaseSink:
    loop: EngineLoop

    def release(self, request_id: str) -> None:
        self.loop.release_kv([request_id])


class HeldInProcessTransfer(KVTransfer):
    """Holds slots like CudaIpcTransfer; copies them out of the producer's pools in-process."""

    name = "held-inprocess"
    holds_slots = True
    hold_s = HOLD_S
    lose_next = False  # the next ticket is never claimed (a gateway that died in between)

    def bind(self, pools: tuple[KVPool, KVPool | None], release: ReleaseSink) -> None:
        self.pools, self.sink = pools, release

    def send_held(self, request_id: str, held: HeldKV, nbytes: int) -> TransferTicket:
        return TransferTicket(request_id, self.name, held, nbytes, time.time())

    def send(self, request_id: str, handoff: KVHandoff) -> TransferTicket:
        raise AssertionError("a holding transport never exports")

    async def receive(self, ticket: TransferTicket, timeout_s: float) -> KVHandoff:
        held: HeldKV = ticket.payload
        if self.lose_next:
            self.lose_next = False
            raise TransferError("KV transfer failed: the ticket was lost")
        target, draft = self.pools
        slots = torch.from_numpy(held.slots)
        handoff = held.with_kv(target.read(slots), None if draft is None else draft.read(slots))
        self.sink.release(held.request_id)
        return handoff


QUESTIONS = ["What is the capital of France?", "Name three primary colours."]


@pytest.fixture(scope="module")
def reference(engine_core: Any) -> list[str]:
    """The offline engine's greedy answers, before the workers take the engine."""
    return greedy_reference(engine_core, [chat_token_ids(engine_core, q) for q in QUESTIONS], 24)


@pytest.fixture(scope="module")
def loops(engine_core: Any, reference: list[str]) -> Iterator[tuple[EngineLoop, EngineLoop, HeldInProcessTransfer]]:
    from engine.core import EngineCore

    drain(engine_core)
    transfer = HeldInProcessTransfer()
    spec = engine_core.config.speculative is not None
    prefill = EngineLoop(
        engine_core, role="prefill", replica_id="p0", transfer=transfer, max_num_seqs=32, speculative=spec
    ).start()
    transfer.bind(engine_core.kv_pools(), LoopReleaseSink(prefill))
    decode_engine = EngineCore(test_engine_config())
    decode = EngineLoop(
        decode_engine, role="decode", replica_id="d0", transfer=transfer, max_num_seqs=32, speculative=spec
    ).start()
    yield prefill, decode, transfer
    prefill.shutdown()
    decode.shutdown()
    drain(engine_core)


@pytest.fixture(scope="module")
def url(loops: tuple[EngineLoop, EngineLoop, HeldInProcessTransfer]) -> Iterator[str]:
    prefill, decode, _ = loops
    discovery = StaticDiscovery([LocalWorkerClient("p0", prefill), LocalWorkerClient("d0", decode)])
    with serve(create_app(discovery, GatewayConfig(pool=FAST_POOL))) as base:
        wait_ready(base, 60)
        yield base


def slots_in_use(loops: tuple[EngineLoop, EngineLoop, HeldInProcessTransfer]) -> list[int]:
    return [loop.stats().engine.kv_used_slots for loop in loops[:2]]


def wait_free(loops: tuple[EngineLoop, EngineLoop, HeldInProcessTransfer], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while slots_in_use(loops) != [0, 0]:
        assert time.monotonic() < deadline, slots_in_use(loops)
        time.sleep(0.05)


def ask(url: str, question: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=24, temperature=0, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in response if c.choices)


def test_held_handoff_equals_colocated_and_frees_the_slots(
    url: str, loops: Any, engine_core: Any, reference: list[str]
) -> None:
    answers = [ask(url, q) for q in QUESTIONS]
    wait_free(loops, timeout_s=1.0)  # released by the receiver's report, not by the hold's end
    assert engine_core.num_held == 0
    assert answers == reference


def test_an_unclaimed_hold_is_freed_after_its_time(url: str, loops: Any, engine_core: Any) -> None:
    loops[2].lose_next = True
    with pytest.raises(openai.APIError, match="KV transfer"):
        ask(url, "What is 12 times 12?")
    assert engine_core.num_held == 1  # nobody released it
    wait_free(loops, timeout_s=HOLD_S + 2)
    assert ask(url, "What is 12 times 12?")  # and the worker serves on


def device_ticket(node: str, age_s: float, hold_s: float = 10.0) -> TransferTicket:
    pools = PoolHandles("p", node, "GPU-0", 0, target=((lambda: None, ()), (lambda: None, ())), draft=None)  # type: ignore[arg-type]
    held = HeldKV("r", (1, 2), (3,), SamplingParams(), 7, 2, np.array([5, 6]), 0.0)
    payload = DevicePayload(pools, held, LoopReleaseSink(None), hold_s)  # type: ignore[arg-type]
    return TransferTicket("r", "cuda-ipc", payload, 0, time.time() - age_s)


@pytest.mark.parametrize(
    ("node", "age_s", "message"),
    [("elsewhere/boot", 0.0, "use --kv-transfer ray across nodes"), (None, 6.0, "its slots may be freed")],
    ids=["another node", "near the hold's end"],
)
def test_cuda_ipc_refuses_what_it_must_not_read(node: str | None, age_s: float, message: str) -> None:
    with pytest.raises(TransferError, match=message):
        CudaIpcTransfer().check(device_ticket(node or node_id(), age_s))


def test_cuda_ipc_binds_only_device_pools(engine_core: Any) -> None:
    with pytest.raises(ValueError, match="needs the KV pools on a GPU"):
        CudaIpcTransfer().bind(engine_core.kv_pools(), LoopReleaseSink(None))  # type: ignore[arg-type]
