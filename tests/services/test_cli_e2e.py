"""The `dspark-serve` command itself, as users run it: `up` on one machine, and `worker` +
`gateway` against an existing Ray cluster. Each loads the model again: slow."""

from __future__ import annotations

import signal
from pathlib import Path

import openai
import pytest

from tests.services.cli_process import dspark_serve, ray_head, wait_for_line
from tests.services.conftest import MODEL
from tests.services.serving import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def ask(port: int) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
    )
    return response.choices[0].message.content or ""


def test_up_serves_and_shuts_down_cleanly(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "up.log"
    with dspark_serve(
        "up",
        "--port",
        str(port),
        "--num-cpus",
        "4",
        "--max-num-seqs",
        "8",
        "--kv-cache-memory-bytes",
        str(512 * 1024 * 1024),
        log=log,
    ) as process:
        line = wait_for_line(log, "dspark-serve ready:", process, 900)
        assert f"http://127.0.0.1:{port}/v1" in line and f"model={MODEL}" in line
        assert "decode=1" in line and "prefill=1" in line
        assert ask(port)
        frozen = [entry for entry in log.read_text().splitlines() if "long-lived objects frozen" in entry]
        for process_name in ("gateway:", "prefill ", "decode "):  # services/heap.py, in each process
            assert any(process_name in entry for entry in frozen), frozen
        process.send_signal(signal.SIGTERM)  # what Kubernetes sends
        assert process.wait(90) == 0
        assert "leaked" not in log.read_text()  # thawed before exit: native extensions see their objects freed


def test_worker_and_gateway_join_an_existing_cluster(tmp_path: Path) -> None:
    with ray_head(free_port(), tmp_path / "head.log") as address:
        options = {
            "DSPARK_RAY_ADDRESS": address,
            "DSPARK_NAMESPACE": "cli-test",
            "DSPARK_DEPLOYMENT": "cli",
            "DSPARK_KV_CACHE_MEMORY_BYTES": str(512 * 1024 * 1024),
        }
        worker_log = tmp_path / "worker.log"
        with dspark_serve("worker", "--role", "colocated", "--replicas", "1", log=worker_log, env=options) as worker:
            assert worker.wait(900) == 0, worker_log.read_text()[-3000:]
        assert "cli-worker-0 ready" in worker_log.read_text()
        port = free_port()
        gateway_log = tmp_path / "gateway.log"
        with dspark_serve("gateway", "--port", str(port), log=gateway_log, env=options) as gateway:
            wait_for_line(gateway_log, "dspark-serve ready:", gateway, 300)
            assert ask(port)
