"""The gateway's calls to a worker (services/workers/client.py) when they are cancelled or time
out, on stand-ins for a Ray actor handle and an engine loop whose answers the test sets.

The gateway stops its pump and monitor loops by cancelling them (`WorkerPool.stop`, at
shutdown). A call cancelled in the loop iteration in which its answer lands must raise
CancelledError: a loop handed the answer instead runs on, and `dspark-serve up` never exits
after SIGTERM (tests/services/test_cli_shutdown.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from services.workers.client import LocalWorkerClient, RayWorkerClient, WorkerUnavailable

TIMEOUT_S = 0.05


def ray_handle(answer: concurrent.futures.Future[Any]) -> Any:
    """An actor handle whose `stats.remote()` returns a ref resolving to `answer`."""
    ref = SimpleNamespace(future=lambda: answer)
    return SimpleNamespace(stats=SimpleNamespace(remote=lambda *args: ref))


def ray_stats(answer: concurrent.futures.Future[Any]) -> Coroutine[Any, Any, Any]:
    return RayWorkerClient("worker-0", "worker", ray_handle(answer)).stats(TIMEOUT_S)


def local_add_request(answer: concurrent.futures.Future[Any]) -> Coroutine[Any, Any, Any]:
    loop = SimpleNamespace(role="worker", alive=True, add_request=lambda *args, **kwargs: answer)
    client = LocalWorkerClient("local-0", loop)  # type: ignore[arg-type]
    return client.add_request("gateway", "req-0", [1, 2, 3], None, False, TIMEOUT_S)  # type: ignore[arg-type]


CALLS = [pytest.param(ray_stats, id="ray-stats"), pytest.param(local_add_request, id="local-add-request")]


@pytest.mark.parametrize("call", CALLS)
def test_a_call_cancelled_as_its_answer_lands_is_cancelled(
    call: Callable[[concurrent.futures.Future[Any]], Coroutine[Any, Any, Any]],
) -> None:
    async def main() -> None:
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        task = asyncio.create_task(call(answer))
        await asyncio.sleep(0)  # the call is made and waits for its answer
        answer.set_result("answer")  # as Ray's thread would: the hand-over to the loop is queued
        task.cancel()  # in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


@pytest.mark.parametrize("call", CALLS)
def test_a_call_without_an_answer_times_out_as_worker_unavailable(
    call: Callable[[concurrent.futures.Future[Any]], Coroutine[Any, Any, Any]],
) -> None:
    async def main() -> None:
        with pytest.raises(WorkerUnavailable, match="timed out"):
            await call(concurrent.futures.Future())

    asyncio.run(main())
