"""SIGTERM to a real `dspark-serve up` process under ten streams (docs/design.md §6.9): the
signal reaches the drain through the command's own handlers (services/cli/_runtime.py), the
process then exits by itself, and the Ray cluster it started goes with it.

tests/services/test_shutdown.py covers the drain's rules on an in-process server; this one is
about the process: its signal handling, its exit and what it leaves on the machine."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services.cli_process import descendants, dspark_serve, still_alive, stream_events, wait_for_line
from tests.services.conftest import KV_BYTES, MODEL
from tests.services.serving import free_port

pytestmark = pytest.mark.timeout(600)

GRACE_S = 3.0
# after the grace: uvicorn's close (the last events written), killing the workers, and stopping
# the local Ray cluster (GCS, raylet) on a shared two-core machine
EXIT_MARGIN_S = 30.0


@pytest.mark.parametrize(
    "topology",
    [
        pytest.param(("--colocated",), id="colocated"),
        # the default `up`: a request also waits in the prefill queue and the KV hand-off
        pytest.param(("--prefill-workers", "1", "--decode-workers", "1"), id="disaggregated", marks=pytest.mark.slow),
    ],
)
def test_sigterm_drains_the_up_process_and_it_exits_with_its_ray_cluster(
    topology: tuple[str, ...], tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "up.log"
    url = f"http://127.0.0.1:{port}"
    with dspark_serve(
        "up",
        *topology,
        "--port",
        str(port),
        "--num-cpus",
        "4",
        "--max-num-seqs",
        "16",
        "--kv-cache-memory-bytes",
        str(KV_BYTES),
        "--shutdown-grace",
        str(GRACE_S),
        log=log,
    ) as process:
        wait_for_line(log, "dspark-serve ready:", process, 900)
        ray_processes = descendants(process.pid)
        assert any("raylet" in p.name() for p in ray_processes), [p.name() for p in ray_processes]

        lengths = [4] * 5 + [4000] * 5  # five finish within the grace, five cannot
        started = [threading.Event() for _ in lengths]
        with concurrent.futures.ThreadPoolExecutor(len(lengths)) as pool:
            futures = [pool.submit(stream_events, url, n, event) for n, event in zip(lengths, started, strict=True)]
            for event in started:
                assert event.wait(300), log.read_text()[-3000:]
            process.send_signal(signal.SIGTERM)  # what Kubernetes sends
            signalled_at = time.monotonic()

            ready = httpx.get(f"{url}/ready", timeout=10)
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            refused = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                timeout=10,
            )
            assert refused.status_code == 503 and refused.json()["error"]["message"]
            results = [f.result(timeout=GRACE_S + EXIT_MARGIN_S) for f in futures]

        for n, events in zip(lengths, results, strict=True):
            assert events[-1] == "[DONE]", events[-3:]  # never a cut body
            payloads: list[dict[str, Any]] = [json.loads(e) for e in events[:-1]]
            if n == 4:
                assert not any("error" in p for p in payloads)
                assert payloads[-1]["choices"][0]["finish_reason"] == "length"
            else:
                assert "shutting down" in payloads[-1]["error"]["message"], payloads[-1]

        assert process.wait(GRACE_S + EXIT_MARGIN_S) == 0, log.read_text()[-3000:]
        exited_after_s = time.monotonic() - signalled_at
    assert GRACE_S <= exited_after_s < GRACE_S + EXIT_MARGIN_S
    assert still_alive(ray_processes, timeout_s=5) == [], "Ray processes outlived `dspark-serve up`"
