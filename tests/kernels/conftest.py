"""Fixtures of the kernel tests, laid out as engine/kernels is: triton/ holds one test file per
Triton kernel (model shapes on a GPU: triton/test_kernels_gpu.py); test_fused_paths.py runs the
models through the dispatchers. Each Triton kernel runs interpreted on CPU (TRITON_INTERPRET=1,
tiny shapes) and compiled when a GPU is present, against its torch reference on fresh random
data. The attention kernels need a child process for the interpreter (tests/attention), the C
kernels a compiler (tests/cpu_kernels)."""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.kernels.triton import activation, launch, norm, rope, skinny_linear, store_kv

sys.path.insert(0, str(Path(__file__).parent))  # kernel_cases, for any import mode
KERNEL_MODULES = (activation, norm, rope, skinny_linear, store_kv)  # the Triton modules jitted on first use


@pytest.fixture(autouse=True)
def triton_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Interpreted on CPU; each test compiles its kernels afresh for its mode."""
    if not launch.available():
        pytest.skip("triton is not installed")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    for module in KERNEL_MODULES:
        module._compiled.cache_clear()
    yield
    for module in KERNEL_MODULES:
        module._compiled.cache_clear()  # later GPU tests compile them for real


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """Stable per test id (each parametrization draws different data), shifted by
    DSPARK_TEST_SEED to draw fresh data on demand."""
    seed = zlib.crc32(request.node.nodeid.encode()) + int(os.environ.get("DSPARK_TEST_SEED", "0"))
    return torch.Generator().manual_seed(seed)
