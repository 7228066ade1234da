"""How fast outputs travel from a worker's step thread to the gateway, for the two ways a
Ray actor can stream: the long poll the workers use (`Outbox`: one call returns every
output a consumer got since its previous call) and one Ray streaming generator per request.

A producer thread in the actor emits one output per request every `--step-ms` (an engine
step); the driver measures emit -> receive on the host's monotonic clock.

    python -m services.bench.transport --requests 1,8,32

Measured 2026-12-02 on the project's CPU machine (2 cores, shared with other jobs, load
average 7-12), 20 ms steps, 150 steps:

    requests   long poll mean / p99     streaming generator mean / p99
    1          2.3 ms / 6.2 ms          2.7 ms / 6.5 ms
    8          2.8 ms / 8.1 ms          6.7 ms / 26.8 ms
    32         4.0 ms / 15.7 ms         105.6 ms / 249.2 ms

Per-request generators cost one object and one RPC per token per request, which the actor's
event loop cannot keep up with on two cores; the long poll costs one RPC per step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time

import ray

from engine.outputs import RequestOutput
from services.workers.outbox import Outbox
from services.workers.types import WorkerEvent


@ray.remote
class _PollingProducer:
    def __init__(self) -> None:
        self.outbox = Outbox()

    async def start(self, requests: int, steps: int, step_s: float) -> None:
        def produce() -> None:
            for step in range(steps):
                time.sleep(step_s)
                emitted = time.monotonic()
                events = [
                    WorkerEvent(RequestOutput(f"r{i}", (step,), "x", (), stop_reason=emitted))  # type: ignore[arg-type]
                    for i in range(requests)
                ]
                self.outbox.put_many({"bench": events})

        threading.Thread(target=produce, daemon=True).start()

    async def poll(self, timeout_s: float) -> list[WorkerEvent]:
        return await self.outbox.take("bench", timeout_s)


@ray.remote
class _GeneratorProducer:
    def __init__(self) -> None:
        self.queues: dict[int, asyncio.Queue[float | None]] = {}

    async def start(self, requests: int, steps: int, step_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.queues = {i: asyncio.Queue() for i in range(requests)}

        def produce() -> None:
            for _ in range(steps):
                time.sleep(step_s)
                emitted = time.monotonic()
                for queue in self.queues.values():
                    loop.call_soon_threadsafe(queue.put_nowait, emitted)
            for queue in self.queues.values():
                loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=produce, daemon=True).start()

    async def stream(self, request: int):  # type: ignore[no-untyped-def]
        queue = self.queues[request]
        while (emitted := await queue.get()) is not None:
            yield emitted


async def _long_poll(requests: int, steps: int, step_s: float) -> list[float]:
    actor = _PollingProducer.remote()  # type: ignore[attr-defined]
    await actor.start.remote(requests, steps, step_s)
    latencies: list[float] = []
    while len(latencies) < requests * steps:
        events = await actor.poll.remote(1.0)
        received = time.monotonic()
        latencies.extend(received - float(e.output.stop_reason) for e in events)
    ray.kill(actor)
    return latencies


async def _generators(requests: int, steps: int, step_s: float) -> list[float]:
    actor = _GeneratorProducer.remote()  # type: ignore[attr-defined]
    await actor.start.remote(requests, steps, step_s)
    latencies: list[float] = []

    async def consume(request: int) -> None:
        async for ref in actor.stream.remote(request):
            emitted = await ref
            latencies.append(time.monotonic() - emitted)

    await asyncio.gather(*(consume(i) for i in range(requests)))
    ray.kill(actor)
    return latencies


def _summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.mean(ordered) * 1000:.1f} ms / {p99 * 1000:.1f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", default="1,8,32")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    step_s = args.step_ms / 1000
    print("requests   long poll mean / p99     streaming generator mean / p99")
    for requests in (int(x) for x in args.requests.split(",")):
        poll = asyncio.run(_long_poll(requests, args.steps, step_s))
        gen = asyncio.run(_generators(requests, args.steps, step_s))
        print(f"{requests:<10} {_summary(poll):<24} {_summary(gen)}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
