"""Kernel and engine tests that run Triton kernels interpreted on CPU (TRITON_INTERPRET=1).

`triton.jit` decides between interpreted and compiled when a function is decorated, and
triton's own library functions (`tl.max`, `tl.sum`, `tl.cdiv`, ... are `@triton.jit` in
triton.language.standard) are decorated when triton is first imported. An interpreted kernel
that calls a compiled library function fails ("Cannot call @triton.jit'd outside of the scope
of a kernel"), so the variable has to be set before the first `import triton` of the process,
and any other test of the session may have imported triton already. Such tests therefore live
in modules whose names lack `test_` and run in a child pytest process (`run_interpreted`); the
child module calls `require_interpreter()` first. A child process costs a few seconds of
start-up and is immune to collection order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INCOMPATIBLE = "interpreter-incompatible"


def run_interpreted(cases: Path, timeout_s: float = 600) -> None:
    """Run the test module `cases` in a child pytest under TRITON_INTERPRET=1; fail with its
    report if anything failed, skip if the module found the interpreter unable to run."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", str(cases), "-q", "-p", "no:cacheprovider", "--tb=short", "-rfEs"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    report = proc.stdout[-12000:] + proc.stderr[-3000:]
    if INCOMPATIBLE in proc.stdout:  # the module skipped itself (exit code 5)
        line = next(line for line in proc.stdout.splitlines() if INCOMPATIBLE in line)
        pytest.skip(line[line.index(INCOMPATIBLE) :])
    assert proc.returncode == 0, f"interpreter suite failed ({' '.join(cmd)}):\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


def require_interpreter() -> None:
    """In a child module: skip it unless triton runs interpreted here, with loops whose bounds
    are runtime values (as every attention kernel has)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)
    import numpy as np
    import triton

    from tests.triton_interpreter_probe import interpreter_runs_runtime_loops

    if not interpreter_runs_runtime_loops():
        pytest.skip(
            f"{INCOMPATIBLE}: the interpreter of triton {triton.__version__} cannot run loops with "
            f"runtime bounds under numpy {np.__version__} (use numpy<2.4 or a newer triton)",
            allow_module_level=True,
        )
