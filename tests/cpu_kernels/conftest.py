"""Fixtures of the C kernel tests (CPU only; the kernels are compiled at first use)."""

from __future__ import annotations

import os
import zlib

import pytest


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """Stable per test id, shifted by DSPARK_TEST_SEED to draw fresh data on demand."""
    return zlib.crc32(request.node.nodeid.encode()) + int(os.environ.get("DSPARK_TEST_SEED", "0"))
