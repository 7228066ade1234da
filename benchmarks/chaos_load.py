"""The chaos soak's load and how each stream is judged.

Agentic sessions (services/bench/workloads.py: a shared system prompt, a history that grows
by short turns) stream chat completions over SSE. Most turns are greedy, some sampled with a
seed; some are hung up on by the client after a few content chunks. Every stream is read to
its end and given one outcome, strictly by the wire protocol (docs/design.md §6.3):

- completed: 200, a finish_reason, then `data: [DONE]`, then nothing;
- client_aborted: the client hung up on purpose before the end;
- error_event: 200, an error event, then `data: [DONE]`;
- refused: a non-200 answer in OpenAI's error shape with 429, 503 or 504;
- failed: anything else: another status, a body cut before `[DONE]` (a truncated stream),
  `[DONE]` without a finish or an error, data after `[DONE]`, or no end within the deadline
  plus the hang margin (a hang).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.bench.workloads import AgenticWorkload, WorkloadConfig

OK_OUTCOMES = ("completed", "client_aborted", "error_event", "refused")
REFUSAL_STATUSES = (429, 503, 504)


@dataclass(frozen=True)
class LoadConfig:
    sessions: int = 6  # concurrent agentic sessions
    sampled_share: float = 0.2  # turns sampled at temperature 0.8 with a seed; the rest greedy
    abort_share: float = 0.1  # turns the client hangs up on after 1-4 content chunks
    max_tokens: int = 24
    system_prompt_words: int = 150
    turns: tuple[int, int] = (2, 5)
    think_time_s: float = 0.2
    hang_margin_s: float = 30.0  # past the deadline plus this, a stream that has not ended is a hang


@dataclass
class StreamRecord:
    phase: str  # "baseline", "chaos" or "reference"
    kind: str  # "greedy" or "sampled"
    body: dict[str, Any]
    abort_after: int | None  # content chunks read before hanging up (None: read to the end)
    start_s: float  # time.monotonic() at send
    end_s: float = 0.0
    first_token_s: float | None = None
    status: int | None = None
    outcome: str = "failed"
    detail: str = ""  # why it failed, or the error event's message
    text: str = ""
    finish_reason: str | None = None
    reference: str | None = None  # greedy: the text of an undisturbed run of the same body

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    def summary(self) -> dict[str, Any]:
        """What --json keeps of it (the messages are long and reproducible from the seed)."""
        return {
            "phase": self.phase,
            "kind": self.kind,
            "outcome": self.outcome,
            "status": self.status,
            "detail": self.detail,
            "abort_after": self.abort_after,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "finish_reason": self.finish_reason,
            "text": self.text,
            "equal_to_reference": None if self.reference is None else self.text == self.reference,
        }


class _Stream:
    """Reads one SSE body line by line into a StreamRecord."""

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self.chunks = 0  # content chunks so far
        self.done = False
        self.error: str | None = None

    def line(self, line: str) -> None:
        if not line or line.startswith(":"):  # event separator, or an SSE comment (keep-alive)
            return
        if not line.startswith("data: "):
            raise ValueError(f"not an SSE data line: {line[:80]!r}")
        data = line.removeprefix("data: ")
        if self.done:
            raise ValueError(f"data after [DONE]: {data[:80]!r}")
        if data == "[DONE]":
            self.done = True
            return
        payload = json.loads(data)
        if "error" in payload:
            self.error = str(payload["error"].get("message", payload["error"]))
            return
        for choice in payload.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                if self.record.first_token_s is None:
                    self.record.first_token_s = time.monotonic()
                self.chunks += 1
                self.record.text += content
            if choice.get("finish_reason"):
                self.record.finish_reason = choice["finish_reason"]

    def outcome(self) -> tuple[str, str]:
        if not self.done:
            return "failed", "cut: the body ended before data: [DONE]"
        if self.error is not None:
            return "error_event", self.error
        if self.record.finish_reason is None:
            return "failed", "[DONE] without a finish_reason or an error event"
        return "completed", ""


async def _read(client: httpx.AsyncClient, url: str, record: StreamRecord) -> None:
    async with client.stream("POST", f"{url}/v1/chat/completions", json=record.body) as response:
        record.status = response.status_code
        if response.status_code != 200:
            body = (await response.aread()).decode("utf-8", "replace")
            shaped = "error" in json.loads(body) if body.startswith("{") else False
            refused = shaped and response.status_code in REFUSAL_STATUSES
            record.outcome, record.detail = ("refused" if refused else "failed"), f"HTTP {record.status}: {body[:200]}"
            return
        stream = _Stream(record)
        async for line in response.aiter_lines():
            stream.line(line)
            if record.abort_after is not None and stream.chunks >= record.abort_after and not stream.done:
                record.outcome = "client_aborted"
                return  # leaving the block closes the connection mid-stream
        record.outcome, record.detail = stream.outcome()


async def stream_once(client: httpx.AsyncClient, url: str, record: StreamRecord, limit_s: float) -> StreamRecord:
    """Send `record.body`, read the answer into `record`; `limit_s` after which it is a hang."""
    try:
        await asyncio.wait_for(_read(client, url, record), limit_s)
    except asyncio.TimeoutError:
        record.outcome, record.detail = "failed", f"hang: no end after {limit_s:g} s"
    except (httpx.HTTPError, ValueError) as exc:  # a reset or cut connection, a malformed line
        record.outcome, record.detail = "failed", f"{type(exc).__name__}: {exc}"
    record.end_s = time.monotonic()
    return record


def new_turn(rng: random.Random, messages: list[dict[str, str]], cfg: LoadConfig, phase: str) -> StreamRecord:
    body: dict[str, Any] = {
        "model": "",  # set by the caller
        "messages": messages,
        "max_tokens": cfg.max_tokens,
        "stream": True,
    }
    kind = "sampled" if rng.random() < cfg.sampled_share else "greedy"
    if kind == "sampled":
        body |= {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**31)}
    else:
        body["temperature"] = 0.0
    abort_after = rng.randint(1, 4) if rng.random() < cfg.abort_share else None
    return StreamRecord(phase, kind, body, abort_after, start_s=time.monotonic())


@dataclass
class LoadRun:
    """One phase of load: sessions while `keep_going()`, every stream recorded."""

    url: str
    model: str
    cfg: LoadConfig
    seed: int
    phase: str
    limit_s: float  # per stream: the deadline plus the hang margin
    records: list[StreamRecord] = field(default_factory=list)

    async def run(
        self, keep_going: Callable[[], bool], on_record: Callable[[StreamRecord], None] | None = None
    ) -> None:
        workload = AgenticWorkload(
            WorkloadConfig(
                system_prompt_words=self.cfg.system_prompt_words,
                turns_min=self.cfg.turns[0],
                turns_max=self.cfg.turns[1],
                think_time_s=self.cfg.think_time_s,
                max_tokens=self.cfg.max_tokens,
            ),
            self.seed,
        )
        limits = httpx.Limits(max_connections=self.cfg.sessions * 2)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.limit_s), limits=limits) as client:
            await asyncio.gather(
                *(
                    self._sessions(client, workload, random.Random(self.seed * 1000 + i), keep_going, on_record)
                    for i in range(self.cfg.sessions)
                )
            )

    async def _sessions(
        self,
        client: httpx.AsyncClient,
        workload: AgenticWorkload,
        rng: random.Random,
        keep_going: Callable[[], bool],
        on_record: Callable[[StreamRecord], None] | None,
    ) -> None:
        while keep_going():
            session = workload.new_session()
            while keep_going() and (request := session.next_request()) is not None:
                record = new_turn(rng, request.messages, self.cfg, self.phase)
                record.body["model"] = self.model
                self.records.append(record)
                await stream_once(client, self.url, record, self.limit_s)
                if on_record is not None:
                    on_record(record)
                await asyncio.sleep(min(session.think_time_s, 2.0))
                if record.outcome != "completed":
                    break  # an agent whose turn failed starts over
                session.record(record.text)


async def replay_greedy(url: str, records: list[StreamRecord], limit_s: float, concurrency: int = 4) -> None:
    """Set `reference` of each completed greedy record: the text of the same body run again on an
    undisturbed stack (identical bodies once)."""
    todo = [r for r in records if r.kind == "greedy" and r.outcome == "completed"]
    unique: dict[str, list[StreamRecord]] = {}
    for record in todo:
        unique.setdefault(json.dumps(record.body, sort_keys=True), []).append(record)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(limit_s)) as client:

        async def one(same: list[StreamRecord]) -> None:
            async with gate:
                ref = StreamRecord("reference", "greedy", same[0].body, None, start_s=time.monotonic())
                await stream_once(client, url, ref, limit_s)
            if ref.outcome != "completed":
                raise RuntimeError(f"the undisturbed reference run failed: {ref.outcome} {ref.detail}")
            for record in same:
                record.reference = ref.text

        await asyncio.gather(*(one(same) for same in unique.values()))
