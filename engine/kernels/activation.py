"""SwiGLU's gate: `[..., 2I]` laid `[gate | up]` (the fused gate_up projection's output)
-> `silu(gate) * up`, `[..., I]`.

`silu_and_mul_torch` is the reference and the fallback path; the Triton kernel
(engine/kernels/triton/activation.py) does both ops in one pass and rounds `silu(gate)` to the
activation dtype before the product, as the two torch ops do
(tests/kernels/triton/test_activation.py compares them); the C kernel of CPU rows is
engine/kernels/cpu/elementwise.py. `silu_and_mul` picks one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.cpu import elementwise as cpu_elementwise
from engine.kernels.dispatch import use_triton
from engine.kernels.triton.activation import silu_and_mul_triton


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: the Triton kernel on GPU, the C kernel on CPU rows (when built), the torch
    reference elsewhere."""
    if use_triton(x):
        return silu_and_mul_triton(x)
    if x.dim() == 2 and cpu_elementwise.available(x):
        return cpu_elementwise.silu_and_mul(x)
    return silu_and_mul_torch(x)
