"""A real Prometheus server on loopback, scraping the gateway (Debian `prometheus`)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.services.serving import free_port


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        payload = response.json()
        assert payload["status"] == "success", payload
        return list(payload["data"]["result"])

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def scrapes_after(self, job: str, after_unix: float, timeout_s: float = 30.0) -> None:
        """Wait until the target has been scraped successfully after `after_unix`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(f'timestamp(up{{job="{job}"}} == 1)')
            if result and float(result[0]["value"][1]) > after_unix:
                return
            time.sleep(0.3)
        raise TimeoutError(f"Prometheus did not scrape {job} after {after_unix}")


@contextlib.contextmanager
def run_prometheus(target: str, workdir: Path, job: str = "dspark") -> Iterator[Prometheus]:
    binary = prometheus_binary()
    assert binary is not None
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
    )
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
