"""Runs the Triton kernel tests (interpreter_cases.py) under TRITON_INTERPRET=1 on CPU.

They run in a child pytest process, not in this one. `triton.jit` decides between
interpreted and compiled when a function is decorated, and triton's own library functions
(`tl.max`, `tl.sum`, `tl.cdiv`, ... are `@triton.jit` in triton.language.standard) are
decorated when triton is first imported. An interpreted kernel that calls a compiled
library function fails ("Cannot call @triton.jit'd outside of the scope of a kernel"), so
the variable has to be set before the first `import triton` of the process, and any other
test of the session may have imported triton already. Reloading only our kernel modules is
therefore not enough; reloading triton's would break compiled kernels of other tests. A
child process costs a few seconds of start-up and is immune to collection order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CASES = Path(__file__).with_name("interpreter_cases.py")
REPO = Path(__file__).resolve().parents[2]


def test_triton_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider", "--tb=short", "-rfEs"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    report = proc.stdout[-12000:] + proc.stderr[-3000:]
    if "interpreter-incompatible" in proc.stdout:  # the module skipped itself (exit code 5)
        line = next(line for line in proc.stdout.splitlines() if "interpreter-incompatible" in line)
        pytest.skip(line[line.index("interpreter-incompatible") :])
    assert proc.returncode == 0, f"interpreter suite failed ({' '.join(cmd)}):\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
