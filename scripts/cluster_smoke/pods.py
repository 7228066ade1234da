"""A pod as the kubelet runs it: volumes (emptyDir, memory emptyDir, ConfigMap, hostPath), the
container's env (the chart's plus KubeRay's), /etc/hosts in place of cluster DNS, probes, and
restarts under restartPolicy Always with the kubelet's back-off."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.cluster_smoke import kuberay
from scripts.cluster_smoke.manifests import PodPlan, Probe, Release
from scripts.cluster_smoke.runtime import BindMount, Cgroup, Runtime, Sandbox

BACKOFF_S = (0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)  # kubelet: first restart at once, then 10 s doubling


# A pod's own PID namespace (buildah's chroot isolation has none): Ray's `address="auto"` scans the
# processes it can see for GCS and raylet command lines, and on a shared PID namespace a driver took
# another node's raylet for its own.
PID_NAMESPACE = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")


class SmokeError(RuntimeError):
    """A failed step; `pod` names the container whose log explains it."""

    def __init__(self, message: str, pod: Pod | None = None) -> None:
        super().__init__(message)
        self.pod = pod


def resolve_env(plan: PodPlan, secrets_env: dict[str, str]) -> list[tuple[str, str]]:
    """The chart's env with literal values; valueFrom entries only where the smoke can give them."""
    out = []
    for name, value in plan.env:
        if isinstance(value, dict):
            if name not in secrets_env:
                raise SmokeError(f"{plan.role}: env {name} comes from {value['valueFrom']}, which the smoke lacks")
            value = secrets_env[name]
        out.append((name, str(value)))
    return out


def container_env(release: Release, plan: PodPlan, pod_name: str) -> list[tuple[str, str]]:
    """The container's env as the kubelet sets it: the chart's, then what KubeRay adds to Ray pods."""
    env = resolve_env(plan, {})
    if not plan.node_type:
        return env
    head = release.pods["head"]
    port = kuberay.head_port(head.ray_start_params)
    fqdn = kuberay.fqdn_head_service(release.cluster_name, release.namespace)
    start = kuberay.ray_start_command(plan.node_type, plan.ray_start_params, plan.resources, port, fqdn)
    extra = kuberay.operator_env(
        node_type=plan.node_type,
        existing={name for name, _ in env},
        fqdn=fqdn,
        port=port,
        start_cmd=start,
        cluster_name=release.cluster_name,
        namespace=release.namespace,
        pod_name=pod_name,
        group=plan.group,
    )
    return env + extra


def generated_pod_name(release: Release, plan: PodPlan) -> str:
    suffix = secrets.token_hex(3)[:5]
    if plan.node_type:
        return kuberay.pod_name(release.cluster_name, plan.node_type, plan.group, suffix)
    return f"{plan.group}-{secrets.token_hex(5)[:10]}-{suffix}"  # Deployment: <name>-<hash>-<suffix>


def hosts_file(entries: list[tuple[str, list[str]]]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{' '.join(names)}" for address, names in entries]
    return "\n".join(lines) + "\n"


def _volume_source(mount_name: str, volume: dict[str, Any], pod_dir: Path, shared: dict[str, Path]) -> Path:
    """The host directory that stands for a pod volume."""
    if "configMap" in volume:
        return shared[f"configMap:{volume['configMap']['name']}"]
    if "hostPath" in volume:
        return shared[f"hostPath:{volume['hostPath']['path']}"]
    if "emptyDir" in volume:
        return pod_dir / "volumes" / mount_name
    raise SmokeError(f"volume {mount_name}: unsupported source {sorted(volume)}")


def prepare_volumes(plan: PodPlan, pod_dir: Path, shared: dict[str, Path]) -> list[BindMount]:
    """emptyDirs as directories owned by the pod's user (fsGroup), memory ones as sized tmpfs."""
    mounts = []
    for mount in plan.mounts:
        source = _volume_source(mount.name, mount.volume, pod_dir, shared)
        empty_dir = mount.volume.get("emptyDir")
        if empty_dir is not None and not source.exists():
            source.mkdir(parents=True)
            if empty_dir.get("medium") == "Memory":
                size = kuberay.quantity_value(empty_dir.get("sizeLimit", "64Mi"))
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(source)], check=True
                )
            os.chown(source, *plan.run_as)
        mounts.append(BindMount(source, mount.path, mount.read_only))
    return mounts


@dataclass
class Pod:
    """One pod: its sandbox, its container's command and env, its process (one at a time)."""

    plan: PodPlan
    name: str
    address: str
    sandbox: Sandbox
    env: list[tuple[str, str]]
    runtime: Runtime
    log_path: Path
    cgroup: Cgroup
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exits: list[int] = field(default_factory=list)
    _next_start: float = 0.0

    @property
    def command(self) -> list[str]:
        return [*self.plan.command, *self.plan.args]

    def start(self) -> None:
        log = self.log_path.open("ab")
        log.write(f"\n--- start {time.strftime('%H:%M:%S')} (restart {self.restarts}) ---\n".encode())
        log.flush()
        argv = self.cgroup.wrap([*PID_NAMESPACE, *self.runtime.argv(self.sandbox, self.command, self.env)])
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def supervise(self) -> None:
        """The kubelet's part: a container that exited is started again (restartPolicy Always)."""
        code = self.exit_code()
        if code is None or self.plan.restart_policy == "Never":
            return
        now = time.monotonic()
        if not self._next_start:
            self.exits.append(code)
            self.cgroup.kill()
            delay = BACKOFF_S[min(len(self.exits) - 1, len(BACKOFF_S) - 1)]
            self._next_start = now + delay
            print(f"  [kubelet] {self.plan.role}: container exited ({code}); restart in {delay:.0f}s", flush=True)
        if now >= self._next_start:
            self._next_start = 0.0
            self.restarts += 1
            self.start()

    def kill(self) -> None:
        """SIGKILL of the container's whole process tree (what an OOM kill or a node fault does)."""
        self.cgroup.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def exec(self, command: list[str], timeout_s: float) -> tuple[int, str]:
        argv = self.runtime.argv(self.sandbox, command, self.env)
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True) as proc:
            try:
                out, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                return 124, out.decode(errors="replace")
            return proc.returncode, out.decode(errors="replace")

    def http_get(self, path: str, port: int, timeout_s: float) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.address}:{port}{path}", timeout=timeout_s) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode(errors="replace")
        except OSError as e:
            return 0, str(e)

    def probe(self, probe: Probe) -> tuple[bool, str]:
        """One probe run as the kubelet runs it: exec inside the container, HTTP to the pod's address."""
        if probe.kind == "exec":
            code, out = self.exec(list(probe.command), probe.timeout_s)
            return code == 0, out.strip()
        status, body = self.http_get(probe.path, probe.port, probe.timeout_s)
        return 200 <= status < 400, f"HTTP {status} {body[:200]}"

    def last_log(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
