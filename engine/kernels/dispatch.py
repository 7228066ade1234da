"""Which path an elementwise op takes: its fused Triton kernel or its torch reference."""

from __future__ import annotations

import torch

from engine.kernels.triton import launch


def use_triton(x: torch.Tensor, *params: torch.Tensor) -> bool:
    """True on a CUDA/ROCm tensor with triton installed, unless autograd has to record the op:
    the kernels have no backward, and drafter training differentiates through these layers
    (the target's weights are frozen, and serving runs under inference_mode).

    CPU tensors never take Triton: the dispatchers give them the C kernels of
    engine.kernels.cpu when those are built (rounding as the references do), else the torch
    reference."""
    if not x.is_cuda or not launch.available():
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params)))
