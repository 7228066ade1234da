"""KV hand-off failures, in one process: a real prefill engine and a real decode engine,
joined by a transport that can be told to fail or to hang. A failed or timed-out transfer
ends the request with an error (never a hang) and leaves no slots held on either side."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest

from services.gateway import GatewayConfig, create_app
from services.gateway.pool import StaticDiscovery
from services.workers.client import LocalWorkerClient
from services.workers.engine_loop import EngineLoop
from services.workers.transfer import InProcessTransfer, TransferError, TransferTicket
from tests.services.conftest import MODEL, chat_token_ids, drain, greedy_reference, test_engine_config
from tests.services.serving import serve, wait_ready
from tests.services.stack import FAST_POOL

pytestmark = pytest.mark.timeout(900)
TIMEOUT_S = 1.5


class FlakyTransfer(InProcessTransfer):
    """An in-process transport whose receive can fail or hang, as a lost network would."""

    mode = "ok"

    async def receive(self, ticket: TransferTicket, timeout_s: float) -> Any:
        if self.mode == "fail":
            raise TransferError("KV transfer failed: connection reset by peer")
        if self.mode == "hang":
            await asyncio.sleep(3600)
        return await super().receive(ticket, timeout_s)


@pytest.fixture(scope="module")
def decode_engine() -> Any:
    from engine.core import EngineCore

    return EngineCore(test_engine_config())


@pytest.fixture(scope="module")
def transfer() -> FlakyTransfer:
    return FlakyTransfer()


@pytest.fixture(scope="module")
def loops(engine_core: Any, decode_engine: Any, transfer: FlakyTransfer) -> Iterator[tuple[EngineLoop, EngineLoop]]:
    drain(engine_core)
    prefill = EngineLoop(
        engine_core, role="prefill", replica_id="p0", transfer=transfer, max_num_seqs=32, speculative=False
    ).start()
    decode = EngineLoop(
        decode_engine, role="decode", replica_id="d0", transfer=transfer, max_num_seqs=32, speculative=False
    ).start()
    yield prefill, decode
    prefill.shutdown()
    decode.shutdown()
    drain(engine_core)


@pytest.fixture(scope="module")
def url(loops: tuple[EngineLoop, EngineLoop]) -> Iterator[str]:
    prefill, decode = loops
    discovery = StaticDiscovery([LocalWorkerClient("p0", prefill), LocalWorkerClient("d0", decode)])
    with serve(create_app(discovery, GatewayConfig(pool=FAST_POOL, kv_transfer_timeout_s=TIMEOUT_S))) as base:
        wait_ready(base, 60)
        yield base


@pytest.fixture(autouse=True)
def healthy_transport(transfer: FlakyTransfer) -> Iterator[None]:
    transfer.mode = "ok"
    yield
    transfer.mode = "ok"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def assert_no_slots_held(loops: tuple[EngineLoop, EngineLoop], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = [loop.stats().engine for loop in loops]
        if all(s.kv_used_slots == 0 and s.num_running == 0 and s.num_waiting == 0 for s in stats):
            return
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def ask(url: str, question: str, stream: bool, max_tokens: int = 12) -> str:
    response = client(url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        stream=stream,
    )
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in response if c.choices)  # type: ignore[union-attr]
    return response.choices[0].message.content or ""  # type: ignore[union-attr]


def test_handoff_decodes_on_the_decode_engine(url: str, loops: tuple[EngineLoop, EngineLoop]) -> None:
    before = [loop.stats().engine for loop in loops]
    assert ask(url, "What is the capital of France?", stream=True)
    after = [loop.stats().engine for loop in loops]
    assert after[0].prompt_tokens_total > before[0].prompt_tokens_total
    assert after[1].generation_tokens_total > before[1].generation_tokens_total
    assert after[1].prompt_tokens_total == before[1].prompt_tokens_total
    assert_no_slots_held(loops)


@pytest.mark.parametrize("stream", [True, False])
def test_failed_transfer_is_an_error_and_frees_both_sides(
    url: str, loops: tuple[EngineLoop, EngineLoop], transfer: FlakyTransfer, stream: bool
) -> None:
    transfer.mode = "fail"
    start = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        ask(url, "Name three primary colours.", stream=stream)
    assert "KV transfer" in str(info.value) and time.monotonic() - start < 30
    if not stream:
        assert isinstance(info.value, openai.InternalServerError)
        assert info.value.body["code"] == "worker_error"  # type: ignore[index]
    assert_no_slots_held(loops)
    transfer.mode = "ok"
    assert ask(url, "Name three primary colours.", stream=stream)


def test_hung_transfer_times_out(url: str, loops: tuple[EngineLoop, EngineLoop], transfer: FlakyTransfer) -> None:
    transfer.mode = "hang"
    start = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        ask(url, "What is 12 times 12?", stream=True)
    elapsed = time.monotonic() - start
    assert "timed out" in str(info.value) and elapsed < TIMEOUT_S + 10, (elapsed, info.value)
    assert_no_slots_held(loops)
    metrics = httpx.get(f"{url}/metrics").text
    assert f'dspark_requests_total{{model="{MODEL}",role="gateway",status="500"}}' in metrics


def test_client_gone_during_transfer(url: str, loops: tuple[EngineLoop, EngineLoop], transfer: FlakyTransfer) -> None:
    transfer.mode = "hang"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # the first token came from the prefill engine; the transfer hangs
    assert_no_slots_held(loops, TIMEOUT_S + 10)


@pytest.mark.parametrize("stream", [False, True])
def test_echoed_prompt_logprobs_come_with_the_first_token(
    url: str, loops: tuple[EngineLoop, EngineLoop], stream: bool
) -> None:
    """The prefill engine scores the prompt; its logprobs travel with the hand-off's first
    token, and the decode engine generates the rest without computing the prompt again."""
    prompt = "Water boils at one hundred degrees Celsius at sea level, and freezes at"
    before = loops[1].stats().engine
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 2, "temperature": 0}
    kwargs["extra_body"] = {"ignore_eos": True}
    if stream:
        pieces = [c.choices[0] for c in client(url).completions.create(max_tokens=5, stream=True, **kwargs)]
        text = "".join(p.text for p in pieces)
        values = [v for p in pieces if p.logprobs is not None for v in p.logprobs.token_logprobs or []]
    else:
        choice = client(url).completions.create(max_tokens=5, **kwargs).choices[0]
        text, values = choice.text, list(choice.logprobs.token_logprobs or [])  # type: ignore[union-attr]
    scoring = client(url).completions.create(max_tokens=0, **kwargs).choices[0]  # ends on the prefill engine
    scored = list(scoring.logprobs.token_logprobs or [])  # type: ignore[union-attr]
    assert scoring.text == prompt and text.startswith(prompt) and len(text) > len(prompt)
    assert len(values) == len(scored) + 5 and values[0] is None and scored[0] is None
    assert all(abs(a - b) < 1e-4 for a, b in zip(values[1 : len(scored)], scored[1:], strict=True))
    after = loops[1].stats().engine
    assert after.generation_tokens_total >= before.generation_tokens_total + 4
    assert after.prompt_tokens_total == before.prompt_tokens_total
    assert_no_slots_held(loops)


def test_a_handoff_whose_prefill_worker_dies_before_the_transfer_runs_once(
    loops: tuple[EngineLoop, EngineLoop], engine_core: Any
) -> None:
    """docs/design.md §5.6: the prefill worker hands the request off, then goes down before the
    gateway starts the transfer. The request moves (a continuation on the decode worker) and is
    not also transferred there: it completes once, with the text of an undisturbed run (before
    the fix the second start was refused as "already running" and the stream ended in an error)."""
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams
    from services.gateway.dispatcher import Dispatcher
    from services.gateway.pool import PoolConfig, WorkerPool
    from services.router import Router, RouterConfig
    from services.workers.types import WorkerEvent

    prefill, decode = loops
    prompt = chat_token_ids(engine_core, "Name three primary colours.")
    params = SamplingParams(max_tokens=12, temperature=0.0)

    async def run() -> tuple[str, str, str | None]:
        pool = WorkerPool(
            StaticDiscovery([LocalWorkerClient("p0", prefill), LocalWorkerClient("d0", decode)]),
            "race-test",
            PoolConfig(stats_interval_s=0.1),
        )
        dispatcher = Dispatcher(pool, Router(RouterConfig()))
        held: list[WorkerEvent] = []

        def route_events(replica: Any, events: Sequence[WorkerEvent]) -> None:
            # the test owns the pool's hooks: race-0's events from p0 wait here until its hand-off
            waiting = [e for e in events if replica.replica_id == "p0" and e.output.request_id == "race-0"]
            held.extend(waiting)
            dispatcher.on_events(replica, [e for e in events if e not in waiting])

        pool.on_events = route_events
        pool.on_down = dispatcher.on_replica_down
        await pool.start()
        try:
            while not pool.ready():
                await asyncio.sleep(0.05)

            async def text_of(request_id: str) -> tuple[str, str | None]:
                sink: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
                await dispatcher.submit(request_id, 0, prompt, params, sink, time.perf_counter())
                text = ""
                while True:
                    _, out = await asyncio.wait_for(sink.get(), 60)
                    text += out.new_text
                    if out.finished:
                        return text, out.error

            undisturbed, _ = await text_of("race-ref")
            task = asyncio.ensure_future(text_of("race-0"))
            deadline = time.monotonic() + 60
            while not any(e.ticket is not None for e in held):
                assert time.monotonic() < deadline, "race-0 was never handed off"
                await asyncio.sleep(0.01)
            dispatcher.on_events(pool.replicas["p0"], list(held))  # spawns the transfer ...
            pool.mark_down("p0", "killed")  # ... and p0 goes down before it runs
            pool.on_events = dispatcher.on_events
            moved, error = await task
            return undisturbed, moved, error
        finally:
            await pool.stop()

    undisturbed, moved, error = asyncio.run(run())
    assert error is None, error
    assert moved == undisturbed
    assert_no_slots_held(loops)


def test_outputs_match_the_offline_engine(url: str, loops: tuple[EngineLoop, EngineLoop], decode_engine: Any) -> None:
    questions = ["What is the capital of France?", "Who wrote Hamlet?", "What is H2O?"]
    served = [ask(url, q, stream=True, max_tokens=16) for q in questions]
    assert_no_slots_held(loops)
    loops[1].shutdown()  # last test of the module: the decode engine becomes the offline reference
    reference = greedy_reference(decode_engine, [chat_token_ids(decode_engine, q) for q in questions], 16)
    assert served == reference
