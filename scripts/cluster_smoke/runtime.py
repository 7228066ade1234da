"""How a pod's container runs here: `buildah run` on a working container of the image (chroot
isolation, the pod's network namespace), or, where containers cannot run, a process tree with its
own mount namespace and the same mounts. Each container is a freezer cgroup, so that killing it
takes its whole process tree, as a container runtime does."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BUILDAH = ("buildah", "--storage-driver", "vfs")
CGROUP_V1_FREEZER = Path("/sys/fs/cgroup/freezer")
CGROUP_V2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class BindMount:
    source: Path
    target: str
    read_only: bool


@dataclass
class Sandbox:
    """Where one pod's container runs: its name (the hostname), namespace and mounts."""

    name: str
    netns: str
    user: tuple[int, int]
    mounts: list[BindMount]
    container: str = ""  # the buildah working container


class Runtime(Protocol):
    name: str

    def create(self, sandbox: Sandbox, image: str) -> None: ...

    def argv(self, sandbox: Sandbox, command: list[str], env: list[tuple[str, str]]) -> list[str]: ...

    def remove(self, sandbox: Sandbox) -> None: ...


def _netns_exec(netns: str) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


class BuildahRuntime:
    """`buildah run` of the image's working container: the image's user, env and filesystem."""

    name = "buildah"

    def create(self, sandbox: Sandbox, image: str) -> None:
        name = f"dsmk-{sandbox.name}"
        subprocess.run([*BUILDAH, "rm", name], capture_output=True, timeout=120)
        subprocess.run([*BUILDAH, "from", "--pull-never", "--name", name, image], check=True, capture_output=True)
        sandbox.container = name

    def argv(self, sandbox: Sandbox, command: list[str], env: list[tuple[str, str]]) -> list[str]:
        volumes = [f"-v={m.source}:{m.target}{':ro' if m.read_only else ''}" for m in sandbox.mounts]
        envs = [f"--env={k}={v}" for k, v in env]
        user = f"{sandbox.user[0]}:{sandbox.user[1]}"
        run = ["run", "--isolation", "chroot", "--network", "host", "--no-hosts", "--hostname", sandbox.name]
        return [
            *_netns_exec(sandbox.netns),
            *BUILDAH,
            *run,
            "--user",
            user,
            *volumes,
            *envs,
            sandbox.container,
            "--",
            *command,
        ]

    def remove(self, sandbox: Sandbox) -> None:
        # By name: also a container whose `buildah from` was interrupted.
        subprocess.run([*BUILDAH, "rm", f"dsmk-{sandbox.name}"], capture_output=True, timeout=300)

    @staticmethod
    def remove_stale() -> None:
        """Working containers left by an earlier run that was killed before it cleaned up."""
        listing = subprocess.run(
            [*BUILDAH, "containers", "--format", "{{.ContainerName}}"], capture_output=True, text=True
        )
        for name in listing.stdout.split():
            if name.startswith("dsmk-"):
                subprocess.run([*BUILDAH, "rm", name], capture_output=True, timeout=300)


class ProcessRuntime:
    """The host's Python environment (PATH given) as the pod: a private mount and UTS namespace with
    the pod's mounts bound at their paths, run as the pod's user."""

    name = "process"

    def __init__(self, path: str) -> None:
        self.path = path
        self.created: list[Path] = []
        self._lock = threading.Lock()
        self._user_ok: dict[tuple[int, int], bool] = {}

    def create(self, sandbox: Sandbox, image: str) -> None:
        """Mount points missing on the host (/opt/dspark, /models, /home/dspark), removed at the end."""
        with self._lock:
            for mount in sandbox.mounts:
                target = Path(mount.target)
                if not target.exists():
                    target.mkdir(parents=True) if mount.source.is_dir() else target.touch()
                    self.created.append(target)

    def argv(self, sandbox: Sandbox, command: list[str], env: list[tuple[str, str]]) -> list[str]:
        binds = [f"mount --bind {shlex.quote(str(m.source))} {shlex.quote(m.target)}" for m in sandbox.mounts]
        binds += [f"mount -o remount,bind,ro {shlex.quote(m.target)}" for m in sandbox.mounts if m.read_only]
        drop = self._drop_privileges(sandbox.user)
        base_env = [("PATH", self.path), ("HOME", "/home/dspark"), ("PYTHONUNBUFFERED", "1")]
        if os.environ.get("PYTHONPATH"):  # the checkout under test, as the image would carry it
            base_env.append(("PYTHONPATH", os.environ["PYTHONPATH"]))
        env_args = [f"{k}={v}" for k, v in [*base_env, *env]]
        inner = " && ".join([*binds, f"hostname {shlex.quote(sandbox.name)}", 'exec "$@"'])
        return [
            *_netns_exec(sandbox.netns),
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "sh",
            "-c",
            inner,
            "sh",
            *drop,
            "env",
            "-i",
            *env_args,
            *command,
        ]

    def _drop_privileges(self, user: tuple[int, int]) -> list[str]:
        """setpriv to the pod's user, if that user can run this Python (a pyenv under /root it cannot)."""
        drop = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
        if not user[0]:
            return []
        if user not in self._user_ok:
            python = shutil.which("python3", path=self.path) or "python3"
            # Through a shell, as ray-node.sh runs it (setpriv's own exec may still pass where a child's fails).
            probe = [*drop, "sh", "-c", f"exec {shlex.quote(python)} -c pass"]
            check = subprocess.run(probe, capture_output=True, timeout=60)
            self._user_ok[user] = check.returncode == 0
            if not self._user_ok[user]:
                print(f"NOTE: uid {user[0]} cannot run {python}: the process trees run as root", flush=True)
        return drop if self._user_ok[user] else []

    def remove(self, sandbox: Sandbox) -> None:
        for target in reversed(self.created):
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        self.created.clear()


class Cgroup:
    """A cgroup holding one container's processes: the freezer hierarchy on cgroup v1 (frozen, then
    every process SIGKILLed), cgroup.kill on cgroup v2."""

    def __init__(self, name: str) -> None:
        root = CGROUP_V1_FREEZER if CGROUP_V1_FREEZER.is_dir() else CGROUP_V2
        self.path = root / f"dsmk-{name}"
        self.v2 = root == CGROUP_V2

    @staticmethod
    def available() -> bool:
        if CGROUP_V1_FREEZER.is_dir():
            return os.access(CGROUP_V1_FREEZER, os.W_OK)
        return (CGROUP_V2 / "cgroup.controllers").is_file() and os.access(CGROUP_V2, os.W_OK)

    def wrap(self, argv: list[str]) -> list[str]:
        """argv started inside this cgroup: every process it forks stays in it."""
        self.path.mkdir(exist_ok=True)
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *argv]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self, timeout_s: float = 20) -> None:
        """SIGKILL every process at once, so that nothing forks or reacts in between."""
        if not self.path.is_dir():
            return
        if self.v2:
            (self.path / "cgroup.kill").write_text("1")
        else:
            state = self.path / "freezer.state"
            state.write_text("FROZEN")
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            state.write_text("THAWED")
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def remove(self) -> None:
        self.kill()
        with contextlib.suppress(OSError):
            self.path.rmdir()
