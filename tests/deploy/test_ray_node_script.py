"""charts/dspark-serve/files/ray-node.sh, the entry point of every Ray node of the chart, run with
stand-ins for `ray` and `dspark-serve` and a fake raylet health endpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import deploy_support as ds
import pytest

SCRIPT = ds.CHART_DIR / "files" / "ray-node.sh"

# `ray start ... --block` stays up until SIGTERM; `ray stop` is recorded.
FAKE_RAY = """#!/usr/bin/env bash
case "$1" in
  start)
    echo $$ > "$FAKE_DIR/ray-start.pid"
    echo "$@" > "$FAKE_DIR/ray-start.args"
    [[ -n ${FAKE_RAY_START_EXIT:-} ]] && exit "$FAKE_RAY_START_EXIT"
    trap 'exit 0' TERM
    while true; do sleep 0.1; done
    ;;
  stop) echo "$@" >> "$FAKE_DIR/ray-stop.calls" ;;
esac
"""
# `dspark-serve worker` loads its engines and returns; `dspark-serve gateway` serves until SIGTERM.
# Each writes <command>.env last, once its SIGTERM handler is in place.
FAKE_DSPARK = """#!/usr/bin/env bash
trap 'echo terminated > "$FAKE_DIR/$1.terminated"; exit 0' TERM
echo "$@" > "$FAKE_DIR/$1.args"
env | grep '^DSPARK_' | sort > "$FAKE_DIR/$1.env"
if [[ $1 == worker ]]; then
  sleep "${FAKE_LOAD_S:-0.2}"
  exit "${FAKE_WORKER_EXIT:-0}"
fi
[[ $1 == drain ]] && exit "${FAKE_DRAIN_EXIT:-0}"
[[ -n ${FAKE_GATEWAY_EXIT:-} ]] && { sleep 0.3; exit "$FAKE_GATEWAY_EXIT"; }
while true; do sleep 0.1; done
"""


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b"success"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def health_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api/local_raylet_healthz"
    server.shutdown()


@pytest.fixture
def node_env(tmp_path: Path, health_url: str, stop_leftovers: None) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ray", FAKE_RAY), ("dspark-serve", FAKE_DSPARK)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "KUBERAY_GEN_RAY_START_CMD": "ray start --address=head-svc:6379 --num-gpus=8 --block",
        "RAYLET_HEALTH_URL": health_url,
        "GCS_HEALTH_URL": health_url,
        "READY_FILE": str(tmp_path / "engines.ready"),
        "RAY_NODE_WAIT_S": "10",
        "DSPARK_ROLE": "decode",
    }


def dead_url() -> str:
    return f"http://127.0.0.1:{ds.free_port()}/"


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(SCRIPT), *args], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], env=env, text=True, capture_output=True, timeout=30)


def wait_for(path: Path, timeout_s: float = 10) -> str:
    """The file's text, once it exists (with some text, unless it is a marker like *.ready)."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and (path.read_text() or path.suffix == ".ready")):
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)
    return path.read_text()


@pytest.fixture
def stop_leftovers(tmp_path: Path) -> Iterator[None]:
    """Kill the stand-in `ray start` if a test left it running (SIGKILL of the script does not)."""
    yield
    pid_file = tmp_path / "ray-start.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_worker_starts_its_engines_then_lives_with_its_node(node_env: dict[str, str], tmp_path: Path) -> None:
    proc = start(node_env, "worker", "--log-level", "debug")
    try:
        wait_for(tmp_path / "engines.ready")
        assert wait_for(tmp_path / "ray-start.args").split() == [
            "start",
            "--address=head-svc:6379",
            "--num-gpus=8",
            "--block",
        ]
        assert wait_for(tmp_path / "worker.args").split() == ["worker", "--log-level", "debug"]
        assert "DSPARK_ROLE=decode" in wait_for(tmp_path / "worker.env")
        assert run(node_env, "ready").returncode == 0
        assert run(node_env, "check", "worker").returncode == 0
        # `dspark-serve worker` has returned; the pod stays with its Ray node.
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert "stop --grace-period 30" in (tmp_path / "ray-stop.calls").read_text()


def test_worker_is_ready_only_once_its_engines_have_loaded(node_env: dict[str, str], tmp_path: Path) -> None:
    proc = start({**node_env, "FAKE_LOAD_S": "2"}, "worker")
    try:
        wait_for(tmp_path / "worker.env")
        not_yet = run(node_env, "ready")
        assert not_yet.returncode == 1 and "engines not ready yet" in not_yet.stderr
        assert run(node_env, "check", "worker").returncode == 0  # alive all the while
        wait_for(tmp_path / "engines.ready")
        assert run(node_env, "ready").returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_engine_failure_fails_the_container(node_env: dict[str, str], tmp_path: Path) -> None:
    proc = start({**node_env, "FAKE_WORKER_EXIT": "3"}, "worker")
    assert proc.wait(timeout=15) == 3
    assert "stop" in (tmp_path / "ray-stop.calls").read_text()
    assert not (tmp_path / "engines.ready").exists()
    assert "dspark-serve worker failed (status 3)" in (proc.stdout.read() if proc.stdout else "")


def test_losing_the_ray_node_fails_the_container(node_env: dict[str, str], tmp_path: Path) -> None:
    proc = start(node_env, "worker")
    try:
        wait_for(tmp_path / "engines.ready")
        os.kill(int(wait_for(tmp_path / "ray-start.pid")), signal.SIGTERM)
        assert proc.wait(timeout=10) != 0
    finally:
        proc.kill()


def test_gateway_joins_without_resources_and_serves(node_env: dict[str, str], tmp_path: Path) -> None:
    env = {
        **node_env,
        "RAY_HEAD_ADDRESS": "head-svc:6379",
        "RAY_START_EXTRA_ARGS": "--object-store-memory=1000",
    }
    proc = start(env, "gateway", "--log-level", "debug")
    try:
        wait_for(tmp_path / "gateway.env")
        assert wait_for(tmp_path / "ray-start.args").split() == [
            "start",
            "--address=head-svc:6379",
            "--num-cpus=0",
            "--num-gpus=0",
            "--block",
            "--object-store-memory=1000",
        ]
        assert wait_for(tmp_path / "gateway.args").split() == ["gateway", "--log-level", "debug"]
        assert run(env, "check", "gateway").returncode == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    # The gateway was told to stop (and finish its streams) before the node left the cluster.
    assert (tmp_path / "gateway.terminated").exists()
    assert "stop" in (tmp_path / "ray-stop.calls").read_text()


def test_gateway_exit_fails_the_container(node_env: dict[str, str], tmp_path: Path) -> None:
    env = {**node_env, "RAY_HEAD_ADDRESS": "head-svc:6379", "FAKE_GATEWAY_EXIT": "4"}
    proc = start(env, "gateway")
    assert proc.wait(timeout=15) == 4
    assert "stop" in (tmp_path / "ray-stop.calls").read_text()


def test_unhealthy_raylet_gives_up_without_starting_dspark(node_env: dict[str, str], tmp_path: Path) -> None:
    result = run({**node_env, "RAYLET_HEALTH_URL": dead_url(), "RAY_NODE_WAIT_S": "2"}, "worker")
    assert result.returncode == 1 and "raylet not healthy after 2s" in result.stderr
    assert not (tmp_path / "worker.args").exists()


def test_ray_start_failure_is_reported(node_env: dict[str, str]) -> None:
    result = run({**node_env, "FAKE_RAY_START_EXIT": "7", "RAYLET_HEALTH_URL": dead_url()}, "worker")
    assert result.returncode == 7 and "ray start exited with status 7" in result.stderr


def test_check_of_the_head_also_asks_the_gcs(node_env: dict[str, str]) -> None:
    gcs_down = {**node_env, "GCS_HEALTH_URL": dead_url()}
    assert run(gcs_down, "check", "worker").returncode == 0
    assert run(gcs_down, "check", "head").returncode == 1
    assert run(node_env, "check", "head").returncode == 0
    assert run({**node_env, "RAYLET_HEALTH_URL": dead_url()}, "check", "gateway").returncode == 1


def test_head_execs_the_generated_command(node_env: dict[str, str], tmp_path: Path) -> None:
    assert run({**node_env, "FAKE_RAY_START_EXIT": "0"}, "head").returncode == 0
    assert wait_for(tmp_path / "ray-start.args").split()[:2] == ["start", "--address=head-svc:6379"]


def test_stop_leaves_the_cluster(node_env: dict[str, str], tmp_path: Path) -> None:
    assert run(node_env, "stop").returncode == 0
    assert (tmp_path / "ray-stop.calls").read_text().split() == ["stop", "--grace-period", "30"]


@pytest.mark.parametrize("drain_exit", ["0", "1"])
def test_drain_drains_the_engines_then_leaves_the_cluster(
    node_env: dict[str, str], tmp_path: Path, drain_exit: str
) -> None:
    proc = run({**node_env, "FAKE_DRAIN_EXIT": drain_exit}, "drain")
    assert proc.returncode == 0
    assert (tmp_path / "drain.args").read_text().split() == ["drain"]
    assert (tmp_path / "ray-stop.calls").read_text().split() == ["stop", "--grace-period", "30"]


def test_missing_settings_are_explained(node_env: dict[str, str]) -> None:
    no_kuberay = {k: v for k, v in node_env.items() if k != "KUBERAY_GEN_RAY_START_CMD"}
    result = run(no_kuberay, "worker")
    assert result.returncode == 2 and "ray.io/overwrite-container-cmd" in result.stderr
    result = run(node_env, "gateway")
    assert result.returncode == 2 and "RAY_HEAD_ADDRESS" in result.stderr
    assert run(node_env, "bogus").returncode == 2
    assert run(node_env, "check", "planner").returncode == 2
