"""Triton kernel of SwiGLU's silu-and-mul (the reference and the dispatcher are in
engine/kernels/activation.py; tests/kernels/triton/test_activation.py compares).

`[..., 2I]` laid `[gate | up]` -> `silu(gate) * up`, `[..., I]`, in one pass; `silu(gate)` is
rounded to the activation dtype before the product, as the two torch ops round it.
"""

from __future__ import annotations

import torch

from engine.kernels.triton.launch import jit_on_first_use, require_triton, tl, triton

BLOCK = 1024  # output columns per program


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


_compiled = jit_on_first_use(_silu_and_mul_kernel)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> new contiguous [..., I]. One launch, grid (rows, I / BLOCK);
    graph-capturable."""
    require_triton("silu_and_mul_triton")
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
