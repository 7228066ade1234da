"""Runs the Triton kernel tests (interpreter_cases.py) under TRITON_INTERPRET=1 on CPU, in a
child pytest process (tests/triton_interpreter.py says why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted

pytest.importorskip("triton")


def test_triton_kernels_in_the_interpreter():
    run_interpreted(Path(__file__).with_name("interpreter_cases.py"))
