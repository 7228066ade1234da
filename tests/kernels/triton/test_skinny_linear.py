"""The skinny linear kernel: its small-shape cases (skinny_linear_cases.py) in a child pytest,
interpreted on CPU or compiled on a GPU; and on a GPU the model shapes inside a CUDA graph."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_cases import linear_reference, linear_tolerance, randn

from engine.kernels.triton.skinny_linear import skinny_linear_triton
from tests.triton_interpreter import REPO, run_interpreted

CASES = Path(__file__).with_name("skinny_linear_cases.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the cases run compiled (the test below)")
def test_small_shapes_in_the_interpreter() -> None:
    run_interpreted(CASES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_small_shapes_compiled() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider", "--tb=short"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-8000:] + proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("rows", [1, 2, 8])
@pytest.mark.parametrize(
    ("out_features", "in_features", "gated"),
    [(6144, 4096, False), (4096, 14336, False), (14336, 4096, True), (1728, 576, True)],  # Llama-3-8B, SmolLM2
)
def test_model_shapes_in_a_graph(
    rows: int, out_features: int, in_features: int, gated: bool, gen: torch.Generator
) -> None:
    dtype = torch.bfloat16
    x = randn(gen, rows, in_features, dtype=dtype)
    w = randn(gen, 2 * out_features if gated else out_features, in_features, dtype=dtype, scale=in_features**-0.5)
    expected = linear_reference(x, w, None, gated)
    skinny_linear_triton(x, w, gated=gated)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = skinny_linear_triton(x, w, gated=gated)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, expected, **linear_tolerance(dtype, in_features))
