"""`python -m scripts.cluster_smoke`: see docs/kubernetes.md ("Cluster smoke test")."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.cluster_smoke import manifests, netns
from scripts.cluster_smoke.cluster import ROLES, Cluster
from scripts.cluster_smoke.pods import SmokeError
from scripts.cluster_smoke.runtime import BUILDAH, BuildahRuntime, Cgroup, ProcessRuntime, Runtime
from scripts.cluster_smoke.serving import check_metrics, stream_chat

LOCAL_BASE = "localhost/dspark-base:bookworm"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cluster_smoke", description=__doc__)
    parser.add_argument("--profile", default="cpu-dev", help="chart profile to render (default cpu-dev)")
    parser.add_argument("--runtime", choices=("auto", "buildah", "process"), default="auto")
    parser.add_argument("--wheels", default=os.environ.get("DSPARK_WHEELS", "/opt/wheels"), help="for the build")
    parser.add_argument("--rebuild", action="store_true", help="build the image even if it exists")
    parser.add_argument("--ready-timeout", type=float, default=300, help="seconds for all pods to be ready")
    parser.add_argument("--recover-timeout", type=float, default=240, help="seconds for the decode pod to recover")
    parser.add_argument("--keep-logs", type=Path, help="copy the pods' logs here before cleaning up")
    return parser.parse_args(argv)


def image_exists(image: str) -> bool:
    found = subprocess.run([*BUILDAH, "inspect", "--type", "image", image], capture_output=True, timeout=120)
    return found.returncode == 0


def build_image(image: str, wheels: str, rebuild: bool) -> float:
    """scripts/build-image.sh --flavor cpu with buildah when the image is missing; seconds spent."""
    if not rebuild and image_exists(image):
        print(f"image {image} present: reused", flush=True)
        return 0.0
    args = ["bash", str(manifests.REPO / "scripts" / "build-image.sh"), "--flavor", "cpu", "--builder", "buildah"]
    args += ["--tag", image]
    args += ["--base", LOCAL_BASE] if image_exists(LOCAL_BASE) else ["--make-local-base"]
    if Path(wheels).is_dir():
        args += ["--wheels", wheels]
    print("building:", " ".join(args), flush=True)
    started = time.monotonic()
    subprocess.run(args, check=True, timeout=1800)
    return time.monotonic() - started


def pick_runtime(choice: str) -> Runtime:
    if choice in ("auto", "buildah") and shutil.which("buildah"):
        return BuildahRuntime()
    if choice == "buildah":
        raise SmokeError("--runtime buildah: buildah is not installed")
    print(
        "NOTE: containers cannot run here: the four pods run as separate process trees (own `ray start` "
        "nodes, own mount, UTS and network namespaces) from this Python environment, not from the image",
        flush=True,
    )
    return ProcessRuntime(f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")


def check_host() -> None:
    if os.geteuid() != 0:
        raise SmokeError("needs root (network namespaces, tmpfs, cgroups)")
    if not netns.available():
        raise SmokeError("`ip netns` does not work here: four Ray nodes on one host need one namespace each")
    if not Cgroup.available():
        raise SmokeError(f"no writable cgroup (v1 freezer or v2) at {Cgroup('x').path.parent}")


def timing_table(rows: list[tuple[str, float]]) -> str:
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'step':{width}s} | seconds |", f"|{'-' * (width + 2)}|---------|"]
    lines += [f"| {name:{width}s} | {value:7.1f} |" for name, value in rows]
    return "\n".join(lines)


def kill_and_recover(cluster: Cluster, budget_s: float) -> float:
    """SIGKILL of the decode container's process tree; the kubelet restarts it; until serving resumes."""
    decode = cluster.pods["decode"]
    started = time.monotonic()
    decode.kill()
    print(f"killed decode container (exit {decode.exit_code()}); waiting for the restart to rejoin", flush=True)
    cluster.wait_ready(("decode",), budget_s)
    cluster.wait_probe("gateway", "readiness", max(budget_s - (time.monotonic() - started), 1))
    if decode.restarts < 1:
        raise SmokeError("the decode container was not restarted", decode)
    return time.monotonic() - started


def run(args: argparse.Namespace, cluster_box: list[Cluster]) -> list[tuple[str, float]]:
    begun = time.monotonic()
    release = manifests.load_release(args.profile)
    runtime = pick_runtime(args.runtime)
    check_host()
    if runtime.name == "buildah":
        built = build_image(release.pods["head"].image, args.wheels, args.rebuild)
        rows = [("image build (0: present, reused)", built)]
    else:
        rows = [("image build (process runtime: none)", 0.0)]
    if isinstance(runtime, BuildahRuntime):
        runtime.remove_stale()
    network = netns.Network()
    network.setup()
    workdir = Path(tempfile.mkdtemp(prefix="dsmk-", dir="/var/tmp"))  # not under /tmp, which pods mount over
    cluster = Cluster(release, runtime, workdir, network)
    cluster_box.append(cluster)
    started = time.monotonic()
    cluster.create()
    rows.append((f"pods created ({runtime.name})", time.monotonic() - started))
    for role in ROLES:
        print(f"{role:8s} {cluster.pods[role].name} at {cluster.pods[role].address}: {cluster.pods[role].command}")
    started = time.monotonic()
    cluster.start()
    cluster.wait_ready(ROLES, args.ready_timeout)
    rows.append(("cluster ready (start to all probes green)", time.monotonic() - started))
    gateway = cluster.pods["gateway"]
    first = stream_chat(gateway, "Name three colors.")
    rows.append(("first token (streamed chat)", first))
    check_metrics(gateway)
    rows.append(("kill decode to recovered", kill_and_recover(cluster, args.recover_timeout)))
    second = stream_chat(gateway, "Count to five.")
    rows.append(("first token after recovery", second))
    rows.append(("total", time.monotonic() - begun))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    box: list[Cluster] = []
    status = 0
    try:
        rows = run(args, box)
        print(f"\ncluster smoke passed ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n" + timing_table(rows))
    except (SmokeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        status = 1
        print(f"\ncluster smoke FAILED: {e}", file=sys.stderr)
        pod = getattr(e, "pod", None)
        for p in [pod] if pod is not None else (box[0].pods.values() if box else []):
            print(f"--- last log lines of {p.plan.role} ({p.name}) ---\n{p.last_log()}", file=sys.stderr)
    except KeyboardInterrupt:
        status = 130
        print("\ninterrupted: cleaning up", file=sys.stderr)
    finally:
        if box:
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for role, p in box[0].pods.items():
                    shutil.copy(p.log_path, args.keep_logs / f"{role}.log") if p.log_path.exists() else None
            box[0].cleanup()
    return status


if __name__ == "__main__":
    sys.exit(main())
