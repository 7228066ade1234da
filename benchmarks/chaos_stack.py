"""The stack the chaos soak runs against, and the faults it injects.

A real local deployment on this machine: worker actors on a Ray cluster (the caller's, or a
private one started here) and `dspark-serve gateway` as its own process, joined to that
cluster. The faults are the ones a deployment meets:

- `kill9`: SIGKILL of a worker actor's OS process (found by asking the actor for its pid);
  Ray restarts it as a new process that loads the model again (docs/design.md §5.5).
- `drain_and_restart`: what a pod's preStop does (`dspark-serve drain`, docs/design.md §6.9):
  the worker drains with a grace, hands back what is still running, then gets SIGTERM and
  comes back as a new process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ray

from engine.config import EngineConfig
from services.workers.deploy import WorkerOptions, spawn_workers, wait_ready
from services.workers.types import Role, StatsSnapshot

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class StackConfig:
    engine: EngineConfig
    prefill_workers: int = 1
    decode_workers: int = 2  # >= 2: a decode worker's requests have another decode worker to move to
    request_timeout_s: float = 60.0
    migration_limit: int = 3
    torch_threads: int = 1  # per worker: several workers share a few cores
    deployment: str = "chaos"
    ready_timeout_s: float = 900.0
    gateway_args: tuple[str, ...] = ()  # more `dspark-serve gateway` options


@dataclass
class Fault:
    kind: str  # "kill9" or "drain_and_restart"
    worker: str
    at_s: float  # seconds since the soak's start
    held: int  # requests the worker held when it was hit
    pid: int  # the OS process that was hit; the restarted actor runs in another
    back_after_s: float = 0.0  # until the gateway saw it healthy again


@dataclass
class Stack:
    """A running deployment: worker actors by name and the gateway process's base URL."""

    config: StackConfig
    url: str
    handles: dict[str, Any]
    gateway: subprocess.Popen[bytes]
    gateway_log: Path
    faults: list[Fault] = field(default_factory=list)

    def names(self, role: Role) -> list[str]:
        return sorted(name for name in self.handles if f"-{role}-" in name)

    def stats(self, names: Sequence[str] | None = None, timeout_s: float = 30.0) -> dict[str, StatsSnapshot]:
        """Of `names` (default: every worker); raises a Ray error for one that is down."""
        refs = {name: self.handles[name].stats.remote() for name in (self.handles if names is None else names)}
        return {name: ray.get(ref, timeout=timeout_s) for name, ref in refs.items()}

    def pid(self, name: str, timeout_s: float = 30.0) -> int:
        """The OS process of the actor now (a restart makes a new one)."""
        return int(ray.get(self.handles[name].__ray_call__.remote(lambda _actor: os.getpid()), timeout=timeout_s))

    def ready(self) -> dict[str, Any]:
        """The gateway's /ready body (its view of every worker)."""
        return dict(httpx.get(f"{self.url}/ready", timeout=10).json())

    def wait_all_healthy(self, timeout_s: float) -> float:
        """Block until the gateway sees every worker healthy and not draining; returns the seconds taken."""
        start = time.monotonic()
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, ray.exceptions.RayError):
                workers = self.ready()["workers"]
                if len(workers) == len(self.handles) and all(w["healthy"] for w in workers):
                    stats = self.stats()
                    if not any(s.draining for s in stats.values()):
                        return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"workers not all healthy after {timeout_s:g} s: {self.ready()}")
            time.sleep(0.25)

    def kill9(self, name: str, at_s: float) -> Fault:
        held = self.stats([name])[name].num_held
        pid = self.pid(name)
        os.kill(pid, signal.SIGKILL)
        fault = Fault("kill9", name, at_s, held, pid)
        self.faults.append(fault)
        return fault

    def drain_and_restart(self, name: str, grace_s: float, at_s: float) -> Fault:
        handle = self.handles[name]
        held = self.stats([name])[name].num_held
        pid = self.pid(name)
        ray.get(handle.drain.remote(grace_s), timeout=grace_s + 60)
        os.kill(pid, signal.SIGTERM)
        fault = Fault("drain_and_restart", name, at_s, held, pid)
        self.faults.append(fault)
        return fault

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def migrations(self) -> dict[str, float]:
        """dspark_request_migrations_total by reason, as the gateway counts them now."""
        counts: dict[str, float] = {}
        for line in self.metrics().splitlines():
            if line.startswith("dspark_request_migrations_total{"):
                labels, value = line.rsplit(" ", 1)
                reason = labels.split('reason="', 1)[1].split('"', 1)[0]
                counts[reason] = counts.get(reason, 0.0) + float(value)
        return counts

    def gateway_log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.gateway_log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_gateway(config: StackConfig, port: int, log: Path) -> subprocess.Popen[bytes]:
    context = ray.get_runtime_context()
    command = [
        sys.executable,
        "-m",
        "services.cli",
        "gateway",
        "--ray-address",
        context.gcs_address,
        "--namespace",
        context.namespace,
        "--deployment",
        config.deployment,
        "--port",
        str(port),
        "--request-timeout",
        str(config.request_timeout_s),
        "--migration-limit",
        str(config.migration_limit),
        "--stats-interval",
        "0.25",
        "--shutdown-grace",
        "1",
        "--log-level",
        "warning",
        *config.gateway_args,
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("RAY_AUTH_MODE", "disabled")
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_gateway_ready(url: str, gateway: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gateway.poll() is not None:
            raise RuntimeError(f"the gateway exited ({gateway.returncode}):\n{log.read_text(errors='replace')[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        time.sleep(0.25)
    raise TimeoutError(f"gateway not ready after {timeout_s:g} s")


@contextlib.contextmanager
def local_ray(num_cpus: int = 8) -> Iterator[None]:
    """A private Ray cluster for this process, unless one is connected already (a test session's)."""
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",  # never a cluster that happens to run on this machine
        num_cpus=num_cpus,  # logical: one per worker and restarts, not the machine's cores
        namespace="dspark-chaos",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def running_stack(config: StackConfig) -> Iterator[Stack]:
    """Workers and a gateway process on the connected Ray cluster, all stopped on the way out."""
    options = WorkerOptions(num_cpus=1, max_restarts=-1, torch_threads=config.torch_threads)
    handles: dict[str, Any] = {}
    gateway: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="dspark-chaos-") as tmp:
        log = Path(tmp) / "gateway.log"
        try:
            for role, replicas in (("prefill", config.prefill_workers), ("decode", config.decode_workers)):
                handles.update(spawn_workers(role, replicas, config.engine, options, deployment=config.deployment))  # type: ignore[arg-type]
            port = _free_port()
            gateway = _start_gateway(config, port, log)  # starts while the workers load
            wait_ready(handles, config.ready_timeout_s)
            url = f"http://127.0.0.1:{port}"
            _wait_gateway_ready(url, gateway, log, config.ready_timeout_s)
            stack = Stack(config, url, handles, gateway, log)
            stack.wait_all_healthy(config.ready_timeout_s)
            yield stack
        finally:
            if gateway is not None:
                gateway.terminate()  # a drain of --shutdown-grace 1 s, then it exits
                try:
                    gateway.wait(30)
                except subprocess.TimeoutExpired:
                    gateway.kill()
                    gateway.wait(10)
            for handle in handles.values():
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(handle, no_restart=True)
