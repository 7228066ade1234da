"""Whether triton's interpreter runs loops with runtime bounds (imported by
tests/triton_interpreter.require_interpreter, under TRITON_INTERPRET=1 only)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _runtime_loop_probe(out_ptr):
    for i in range(tl.program_id(0), 2):  # loop bounds from a runtime value, as the kernels do
        tl.store(out_ptr + i, i)


def interpreter_runs_runtime_loops() -> bool:
    try:
        _runtime_loop_probe[(1,)](torch.zeros(2, dtype=torch.int32))
    except Exception as exc:  # triton <= 3.6's interpreter calls int() on 1-element arrays
        if "0-dimensional" in repr(exc):
            return False
        raise
    return True
