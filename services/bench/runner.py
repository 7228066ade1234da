"""The load generator: for each concurrency level, that many clients replay sessions of a
workload (with their think times) for a duration or a number of requests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from services.bench.client import RequestResult, stream_chat
from services.bench.progress import BenchProgress, ResultSink
from services.bench.report import LevelSummary, summarize
from services.bench.workloads import Workload


@dataclass(frozen=True)
class RunConfig:
    base_url: str  # e.g. http://127.0.0.1:8000 (or .../v1)
    model: str
    concurrency: tuple[int, ...]
    duration_s: float | None = None
    num_requests: int | None = None  # per level
    api_key: str | None = field(default=None, repr=False)
    request_timeout_s: float = 600.0
    temperature: float | None = None  # sent with every request; None: the server's default

    def __post_init__(self) -> None:
        if (self.duration_s is None) == (self.num_requests is None):
            raise ValueError("give exactly one of duration_s and num_requests")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")

    @property
    def chat_url(self) -> str:
        return api_base(self.base_url) + "/chat/completions"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def discover_model(base_url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient() as client:
        response = await client.get(api_base(base_url) + "/models", headers=headers, timeout=30)
        response.raise_for_status()
        models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{base_url} serves no models yet")
    return str(models[0]["id"])


async def run_level(
    cfg: RunConfig, workload: Workload, concurrency: int, on_result: ResultSink | None = None
) -> tuple[list[RequestResult], float]:
    results: list[RequestResult] = []
    start = time.perf_counter()
    deadline = start + cfg.duration_s if cfg.duration_s is not None else None
    budget = cfg.num_requests

    def may_send() -> bool:
        nonlocal budget
        if deadline is not None:
            return time.perf_counter() < deadline
        assert budget is not None
        if budget <= 0:
            return False
        budget -= 1
        return True

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits) as client:

        async def user() -> None:
            while True:
                session = workload.new_session()
                while (request := session.next_request()) is not None:
                    if not may_send():
                        return
                    result = await stream_chat(
                        client,
                        cfg.chat_url,
                        cfg.model,
                        request,
                        cfg.headers,
                        cfg.request_timeout_s,
                        temperature=cfg.temperature,
                    )
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
                    if not result.ok:
                        break  # the conversation cannot continue without its answer
                    session.record(result.text)
                    if session.think_time_s > 0:
                        if deadline is not None and time.perf_counter() + session.think_time_s > deadline:
                            return
                        await asyncio.sleep(session.think_time_s)

        await asyncio.gather(*(user() for _ in range(concurrency)))
    return results, time.perf_counter() - start


async def run_all(cfg: RunConfig, workload: Workload, progress: BenchProgress | None = None) -> list[LevelSummary]:
    progress = progress or BenchProgress("off")
    summaries = []
    for concurrency in cfg.concurrency:
        level_progress = progress.level(concurrency, duration_s=cfg.duration_s, num_requests=cfg.num_requests)
        async with level_progress as on_result:
            results, elapsed = await run_level(cfg, workload, concurrency, on_result)
        summaries.append(summarize(concurrency, results, elapsed))
    return summaries
