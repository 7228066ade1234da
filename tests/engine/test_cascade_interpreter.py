"""Runs the engine's shared-prefix cases (cascade_interpreter_cases.py) under
TRITON_INTERPRET=1 on CPU, in a child pytest process (tests/triton_interpreter.py says why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted

pytest.importorskip("triton")


def test_the_shared_pass_through_the_engine_in_the_interpreter():
    run_interpreted(Path(__file__).with_name("cascade_interpreter_cases.py"), timeout_s=900)
