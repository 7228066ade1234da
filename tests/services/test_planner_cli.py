"""`dspark-serve planner` as a process: holds while its sources are unreachable, stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from services.cli import main
from tests.services.serving import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_once_fails_when_prometheus_is_unreachable() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["planner", "--once", "--prometheus-url", dead, "--kube-host", dead]) == 1


def test_invalid_policy_is_refused() -> None:
    assert main(["planner", "--once", "--kube-host", "http://127.0.0.1:1", "--scale-down-ratio", "2"]) == 2


def test_loop_holds_and_exits_cleanly_on_sigterm() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "planner", "--interval-s", "0.2"]
        + ["--prometheus-url", dead, "--kube-host", dead],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not any("holding:" in line for line in lines):  # the loop is running
            assert time.monotonic() < deadline and process.poll() is None, "".join(lines)
            lines.append(process.stdout.readline())
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=10)
        output = "".join(lines) + rest
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "holding:" in output and "stopping on SIGTERM" in output
