"""SwiGLU's gate: `[..., 2I]` laid `[gate | up]` (the fused gate_up projection's output)
-> `silu(gate) * up`, `[..., I]`.

`silu_and_mul_torch` is the reference and the CPU path; the Triton kernel does both ops in
one pass and rounds `silu(gate)` to the activation dtype before the product, as the two
torch ops do. `tests/kernels/test_activation.py` compares them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from engine.kernels.cpu import elementwise as cpu_elementwise
from engine.kernels.dispatch import use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without the `gpu` extra run the torch path only
    triton = None

BLOCK = 1024  # output columns per program


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


if triton is not None:

    def _silu_and_mul_kernel(
        x_ptr,  # [T, 2I], last dim contiguous
        out_ptr,  # [T, I] contiguous
        stride_xt,
        inter_size,  # I
        BLOCK: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter_size
        row = x_ptr + token * stride_xt
        gate = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(row + inter_size + cols, mask=mask, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        tl.store(out_ptr + token * inter_size + cols, (silu * up).to(dtype), mask=mask)


@functools.cache
def _compiled() -> Any:  # a triton JITFunction, launched as kernel[grid](...)
    # Wrapped on first use, so TRITON_INTERPRET set by then decides interpreter or GPU.
    assert triton is not None
    return triton.jit(_silu_and_mul_kernel)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> new contiguous [..., I]. One launch, grid (rows, I / BLOCK);
    graph-capturable."""
    if triton is None:
        raise RuntimeError("silu_and_mul_triton needs triton (pip install 'dspark-serve[gpu]')")
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim must be even ([gate | up]), got {x.shape[-1]}")
    inter_size = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inter_size), dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, x.shape[-1])  # a view for [T, 2I] and contiguous inputs
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if out.numel() == 0:
        return out
    _compiled()[(rows.shape[0], triton.cdiv(inter_size, BLOCK))](rows, out, rows.stride(0), inter_size, BLOCK=BLOCK)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: the Triton kernel on GPU, the C kernel on CPU rows (when built), the torch
    reference elsewhere."""
    if use_triton(x):
        return silu_and_mul_triton(x)
    if x.dim() == 2 and cpu_elementwise.available(x):
        return cpu_elementwise.silu_and_mul(x)
    return silu_and_mul_torch(x)
