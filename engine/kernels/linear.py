"""Which kernel multiplies a linear layer's input by its weight (docs/design.md §2.10).

- A GPU forward of one row (batch-1 decode) in bf16/fp16: the skinny Triton kernel
  (engine/kernels/triton/skinny_linear.py), which streams the weight in one launch with no
  split-K reduction and applies SwiGLU to a gate/up weight in the same pass.
- The same kernel takes a pre-norm layer's RMSNorm into the launch of a plain projection
  (`norm_linear`: the attention's qkv).
- Everything else: engine/kernels/cpu/linear.py, which runs the CPU's packed kernels on a
  packed weight and F.linear (cuBLAS / hipBLASLt on a GPU) on a dense one.

The row count is the input's shape, known on the host, so the choice costs no sync and a
captured graph keeps the kernel it was captured with.
"""

from __future__ import annotations

import torch

from engine.kernels.cpu import linear as cpu_linear
from engine.kernels.dispatch import use_triton
from engine.kernels.norm import add_rms_norm, rms_norm
from engine.kernels.triton.skinny_linear import RowNorm, skinny_linear_triton, skinny_norm_linear_triton

__all__ = ["RowNorm", "apply_row_norm", "linear", "linear_swiglu", "norm_linear", "takes_skinny_kernel"]

# Rows up to which the skinny kernel beats the vendor GEMM on a Llama-3-8B step's projections
# (benchmarks/skinny_linear_sweep.py on an H100, docs/benchmarks.md): at one row its best shape
# is 4 % under cuBLAS; at two rows its best only ties, at eight it takes 2.4x as long.
SKINNY_MAX_ROWS = 1
SKINNY_DTYPES = (torch.bfloat16, torch.float16)
# The norm form holds its rows whole in registers for their statistics: at most this many
# features (sm_90, 4 warps: 157 registers at one row of 4,096 features gated, 232 at two; eight
# rows spill). It pays for plain projections only: with the qkv weight it took 0.91x the norm
# kernel plus cuBLAS at one row, with the gated gate/up weight 1.06x (every program re-reads
# the rows for their statistics, and the gated weight has the most programs).
SKINNY_NORM_MAX_FEATURES = 8192


def takes_skinny_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        rows <= SKINNY_MAX_ROWS
        and weight.dtype in SKINNY_DTYPES
        and x.dtype == weight.dtype
        and weight.dim() == 2
        and weight.stride(-1) == 1
        and use_triton(x, weight)
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T + bias -> [..., N]."""
    if takes_skinny_kernel(x, weight):
        return skinny_linear_triton(x, weight, bias)
    return cpu_linear.linear(x, weight, bias)


def linear_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of x [..., K] @ [gate | up] [2I, K]^T + bias -> [..., I]."""
    if takes_skinny_kernel(x, weight):
        return skinny_linear_triton(x, weight, bias, gated=True)
    return cpu_linear.linear_swiglu(x, weight, bias)


def norm_linear(
    x: torch.Tensor,  # [T, K]
    norm: RowNorm,
    weight: torch.Tensor,  # [N, K]; gated: [2I, K]
    bias: torch.Tensor | None = None,
    gated: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (the projection [T, N or I], the residual stream [T, K])
    """A pre-norm layer's RMSNorm (with the residual add before it) and the projection after
    it: (linear(rms_norm(x + residual)), x + residual), or with no residual
    (linear(rms_norm(x)), x). One launch where the skinny kernel takes the rows of a plain
    projection, else the norm kernel and the linear."""
    fits = not gated and x.shape[-1] <= SKINNY_NORM_MAX_FEATURES
    if fits and norm.weight.dtype == x.dtype and takes_skinny_kernel(x, weight):
        return skinny_norm_linear_triton(x, norm, weight, bias)
    normed, stream = apply_row_norm(x, norm)
    project = linear_swiglu if gated else linear
    return project(normed, weight, bias), stream


def apply_row_norm(x: torch.Tensor, norm: RowNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), or (rms_norm(x), x) without a residual: the
    norm alone, for a projection no kernel fuses it into."""
    if norm.residual is None:
        return rms_norm(x, norm.weight, norm.eps), x
    return add_rms_norm(x, norm.residual, norm.weight, norm.eps)
