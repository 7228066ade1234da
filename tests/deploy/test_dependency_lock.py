"""The image installs its Python dependencies from requirements.lock: every requirement of
`ray[default]` (the dashboard and the per-node agent whose HTTP endpoints the chart's probes call,
ray-node.sh check) must be pinned there, at a version that satisfies it, and so must what the
image's build checks import."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
# Imported by the Dockerfile's build check and needed by the per-node agent's HTTP server.
PROBE_STACK = ("aiohttp", "aiohttp-cors", "opencensus", "prometheus-client", "grpcio", "fastapi", "uvicorn")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def ray_requirements(extra: str) -> list[Requirement]:
    """Requirements of the installed ray for the extra, markers evaluated for this Python on Linux."""
    env = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "extra": extra}
    reqs = [Requirement(r) for r in importlib.metadata.requires("ray") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def test_lock_parses() -> None:
    pins = locked()
    assert len(pins) > 50, "requirements.lock looks empty or unparsable"
    assert "ray" in pins


def test_lock_pins_the_installed_ray() -> None:
    assert locked()["ray"] == Version(importlib.metadata.version("ray")), (
        "the installed ray is not the locked one: its requirements below may not be the image's"
    )


@pytest.mark.parametrize("req", ray_requirements("default"), ids=str)
def test_ray_default_requirement_is_locked(req: Requirement) -> None:
    pins = locked()
    name = canonicalize_name(req.name)
    assert name in pins, f"ray[default] needs {req}, which requirements.lock does not pin (make lock)"
    assert req.specifier.contains(pins[name], prereleases=True), f"{req}: locked {name}=={pins[name]}"


@pytest.mark.parametrize("name", PROBE_STACK)
def test_probe_stack_is_locked(name: str) -> None:
    assert canonicalize_name(name) in locked(), f"requirements.lock lacks {name}"


def test_ray_default_extra_is_declared() -> None:
    """The lock is written from pyproject.toml: it must ask for ray with the default extra."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in project["dependencies"]]
    declared += [Requirement(r) for deps in project.get("optional-dependencies", {}).values() for r in deps]
    rays = [r for r in declared if canonicalize_name(r.name) == "ray"]
    assert rays and all("default" in r.extras for r in rays), f"ray must be required as ray[default]: {rays}"


def test_markers_were_evaluated_for_linux() -> None:
    names = {canonicalize_name(r.name) for r in ray_requirements("default")}
    assert {"aiohttp", "aiohttp-cors", "opencensus"} <= names, names
    assert sys.version_info >= (3, 11)
