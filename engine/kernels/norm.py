"""RMSNorm, alone or fused with the residual add that precedes it in a decoder layer.

    y = weight * (x / sqrt(mean(x^2) + eps))      (fp32 statistics)

The normalised value is cast back to the input dtype *before* the weight multiplies it, as
Hugging Face's LlamaRMSNorm does, so results match it in half precision too. The fused form
takes the layer's residual stream: `residual_out = x + residual` (rounded to the input dtype,
as a torch add is) and normalises that, in one pass over the row (the vLLM pattern
`hidden, residual = norm(hidden, residual)`).

Rows are the last dim of `[T, N]` (hidden states) or `[T, heads, N]` (Qwen3's per-head q/k
norm, where the rows are strided views of the fused qkv output). The `*_torch` functions here
are the reference and the fallback path; the Triton kernel (engine/kernels/triton/norm.py) is
one launch of one program per row, checked against them in tests/kernels/triton/test_rms_norm.py;
the C kernel of CPU rows is engine/kernels/cpu/elementwise.py. The dispatchers pick one.
"""

from __future__ import annotations

import torch

from engine.kernels.cpu import elementwise as cpu_elementwise
from engine.kernels.dispatch import use_triton
from engine.kernels.triton.norm import add_rms_norm_triton, rms_norm_triton


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[..., N] -> [..., N] in the promoted dtype of x and weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., N] -> (rms_norm(x + residual), x + residual)."""
    residual = x + residual
    return rms_norm_torch(residual, weight, eps), residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: the Triton kernel on GPU, the C kernel on CPU rows (when
    built), the torch reference elsewhere."""
    if use_triton(x, weight):
        return rms_norm_triton(x, weight, eps)
    if x.dim() == 2 and cpu_elementwise.available(x, weight):
        return cpu_elementwise.rms_norm(x, weight, eps)
    return rms_norm_torch(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): one kernel on GPU or CPU rows, else the torch
    reference."""
    if use_triton(x, residual, weight):
        return add_rms_norm_triton(x, residual, weight, eps)
    if x.dim() == 2 and cpu_elementwise.available(x, residual, weight):
        return cpu_elementwise.add_rms_norm(x, residual, weight, eps)
    return add_rms_norm_torch(x, residual, weight, eps)
