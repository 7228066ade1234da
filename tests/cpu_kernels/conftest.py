"""Fixtures of the C kernel tests (CPU only; the kernels are compiled at first use)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

import pytest


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """Stable per test id, shifted by DSPARK_TEST_SEED to draw fresh data on demand."""
    return zlib.crc32(request.node.nodeid.encode()) + int(os.environ.get("DSPARK_TEST_SEED", "0"))


def isa_levels() -> list[str]:
    """Every level this CPU can build the kernels for: its own ("native") and each cap below
    it (engine/kernels/cpu/isa.py), portable included."""
    from engine.kernels.cpu import isa

    return ["native", *isa.levels_below_cpu()]


@pytest.fixture(params=isa_levels())
def isa_level(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kernels built for one level (`DSPARK_CPU_ISA`): the per-process caches of the
    libraries and their bindings are cleared before and after, so each level loads its own."""
    monkeypatch.setenv("DSPARK_CPU_ISA", request.param)
    _clear_kernel_caches()
    yield request.param
    monkeypatch.undo()
    _clear_kernel_caches()


def _clear_kernel_caches() -> None:
    from engine.kernels.cpu import build, elementwise, gemm, gemv

    for cached in (build.load, elementwise._functions, gemm._functions, gemv._functions, gemv.isa_name):
        cached.cache_clear()
