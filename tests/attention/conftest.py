"""Fixtures of the attention tests."""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # attention_cases, for any import mode


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """Stable per test id (so each parametrization draws different data), shifted by
    DSPARK_TEST_SEED to draw fresh data on demand."""
    return zlib.crc32(request.node.nodeid.encode()) + int(os.environ.get("DSPARK_TEST_SEED", "0"))
