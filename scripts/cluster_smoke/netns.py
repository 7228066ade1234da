"""One network namespace per pod on a private bridge (10.231.7.0/24 by default), so that Ray nodes
on one host keep their fixed ports (GCS 6379, agent 52365, metrics 8080) apart. The namespaces have
no default route: nothing in them reaches beyond the bridge."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

PREFIX = "dsmk"  # names of everything created here: namespaces, links, the bridge


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def available() -> bool:
    """Whether `ip netns` works here (root, iproute2, namespaces allowed)."""
    if shutil.which("ip") is None:
        return False
    probe = f"{PREFIX}-probe"
    _ip("netns", "del", probe, check=False)
    ok = _ip("netns", "add", probe, check=False).returncode == 0
    _ip("netns", "del", probe, check=False)
    return ok


@dataclass
class Network:
    """A bridge with the host at .1 and one namespace (veth pair) per node."""

    subnet: str = "10.231.7"
    bridge: str = f"{PREFIX}-br0"
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    @property
    def host_ip(self) -> str:
        return f"{self.subnet}.1"

    def setup(self) -> None:
        self.teardown_stale()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str, index: int) -> tuple[str, str]:
        """A namespace `dsmk-<name>` with address <subnet>.<index + 1>; returns (namespace, address)."""
        netns, address = f"{PREFIX}-{name}", f"{self.subnet}.{index + 1}"
        host_end, ns_end = f"{PREFIX}{index}h", f"{PREFIX}{index}c"
        _ip("netns", "add", netns)
        self.namespaces.append(netns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        self.links.append(host_end)
        _ip("link", "set", ns_end, "netns", netns)
        _ip("link", "set", host_end, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", ns_end)
        _ip("-n", netns, "link", "set", ns_end, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return netns, address

    def teardown(self) -> None:
        for netns in self.namespaces:
            _ip("netns", "del", netns, check=False)
        for link in self.links:
            _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.namespaces.clear()
        self.links.clear()

    def teardown_stale(self) -> None:
        """Leftovers of an earlier run that was killed before it could clean up (our names only)."""
        listing = _ip("netns", "list", check=False).stdout.split()
        for netns in [n for n in listing if n.startswith(f"{PREFIX}-")]:
            _ip("netns", "del", netns, check=False)
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(PREFIX):
                _ip("link", "del", name, check=False)
