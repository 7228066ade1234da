"""Triton kernel of RMSNorm, alone or fused with the residual add before it (the reference and
the dispatcher are in engine/kernels/norm.py; tests/kernels/triton/test_rms_norm.py compares).

One program per row; the whole row is one tile. Rows are the last dim of `[T, N]` or
`[T, heads, N]` (strided views allowed, the last dim contiguous). The normalised value is
rounded to the input dtype before the weight multiplies it, as the reference does.
"""

from __future__ import annotations

import torch

from engine.kernels.triton.launch import jit_on_first_use, require_triton, tl, triton


def _rms_norm_kernel(
    x_ptr,
    residual_ptr,  # unused without HAS_RESIDUAL
    weight_ptr,
    out_ptr,  # [T, heads, N] contiguous
    residual_out_ptr,  # [T, heads, N] contiguous; unused without HAS_RESIDUAL
    stride_xt,
    stride_xh,
    stride_rt,
    stride_rh,
    eps,
    NUM_HEADS: tl.constexpr,  # rows per token (1 for hidden states)
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,  # next power of two >= N
    HAS_RESIDUAL: tl.constexpr,
):
    # One program per row (token, head); the whole row is one tile.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    out_row = (token * NUM_HEADS + head) * N
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + token * stride_xt + head * stride_xh + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + token * stride_rt + head * stride_rh + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + out_row + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    # tl.sum spelled as the reduce it is: the interpreter patches tl.reduce, while tl.sum
    # stays a compiled-mode function when triton was imported before TRITON_INTERPRET was set.
    mean_sq = tl.reduce(x32 * x32, 0, tl.standard._sum_combine) / N
    normed = (x32 * tl.math.rsqrt(mean_sq + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + out_row + cols, (w * normed.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


_compiled = jit_on_first_use(_rms_norm_kernel)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """x as [T, heads, N] with a contiguous last dim, and its token and head strides."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 3:
        return x, x.stride(0), x.stride(1)
    rows = x.reshape(-1, x.shape[-1])  # a view for [T, N] and contiguous inputs
    return rows.unsqueeze(1), rows.stride(0), 0


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
) -> None:
    require_triton("the rms_norm kernel")
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"rms_norm: weight has shape {tuple(weight.shape)}, rows have {n} elements")
    rows, stride_xt, stride_xh = _rows(x)
    res_rows, stride_rt, stride_rh = _rows(residual) if residual is not None else (rows, 0, 0)
    num_tokens, num_heads = rows.shape[0], rows.shape[1]
    if rows.numel() == 0:
        return
    block_n = triton.next_power_of_2(n)
    _compiled()[(num_tokens, num_heads)](
        rows,
        res_rows,
        weight.contiguous(),
        out,
        residual_out if residual_out is not None else out,
        stride_xt,
        stride_xh,
        stride_rt,
        stride_rh,
        eps,
        NUM_HEADS=num_heads,
        N=n,
        BLOCK_N=block_n,
        HAS_RESIDUAL=residual is not None,
        num_warps=min(max(block_n // 512, 1), 8),
    )


def _new_output(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(x.shape, dtype=dtype, device=x.device)  # contiguous, whatever x's strides


def rms_norm_triton(
    x: torch.Tensor,  # [T, N] or [T, heads, N] (any dims when contiguous); last dim contiguous
    weight: torch.Tensor,  # [N]
    eps: float,
) -> torch.Tensor:  # x's shape, contiguous, in the promoted dtype of x and weight
    """One launch, grid (T, heads); graph-capturable."""
    out = _new_output(x, torch.promote_types(x.dtype, weight.dtype))
    _launch(x, weight, eps, None, out, None)
    return out


def add_rms_norm_triton(
    x: torch.Tensor,  # [T, N] or [T, heads, N]; last dim contiguous
    residual: torch.Tensor,  # x's shape and dtype
    weight: torch.Tensor,  # [N]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one launch. Both outputs are new contiguous
    tensors, never written in place, so a residual stream captured earlier stays intact."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"add_rms_norm: residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}"
        )
    out = _new_output(x, torch.promote_types(x.dtype, weight.dtype))
    residual_out = _new_output(x, x.dtype)
    _launch(x, weight, eps, residual, out, residual_out)
    return out, residual_out
