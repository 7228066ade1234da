"""Linear layers on CPU with weights packed once at start-up.

`F.linear` on a CPU bf16/fp16 weight lays the weight out for the matrix unit on every call. In
decode, a few rows meet every weight of the model once per step, so that copy costs about as
much as the product itself. Each weight is therefore packed once, into one of two layouts:

- bf16 on a CPU with AMX, both dims multiples of 32: our tile kernel (`engine/kernels/cpu/gemm.c`,
  a [N / 32, K / 2, 32, 2] tensor). It streams the weights at close to memory speed for the
  few rows of decode and verify, where oneDNN also pays ~40 us of fixed work per call.
  The MLP's gate/up weight is packed gated there, and its kernel returns SwiGLU's
  silu(gate) * up from the sums (`linear_swiglu`).
- otherwise bf16/fp16 that oneDNN supports here: oneDNN's own layout
  (`mkldnn._reorder_linear_weight`, multiplied with `mkldnn._linear_pointwise`; an opaque
  [N, K] tensor, bit-identical to F.linear on the 2-D inputs the model passes).

The packed weight replaces the dense one, so memory does not grow. float32 weights stay dense:
oneDNN-packed they are faster at 8-16 rows but slower at one row (0.88x). Measured on the
2-core Intel Xeon VM with AMX-BF16: benchmarks/cpu_packed_linear.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.activation import silu_and_mul
from engine.kernels.cpu import gemm

PACKED_DTYPES = (torch.bfloat16, torch.float16)
# oneDNN picks the packed layout for this many rows; the product is exact for any count.
_ROWS_HINT = 16


def cpu_packing_supported(dtype: torch.dtype) -> bool:
    """True when weights of `dtype` can be packed here: a bf16/fp16 dtype, oneDNN built into
    torch, and a CPU that has the instructions for it (else oneDNN would emulate them)."""
    if dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    mkldnn = torch.ops.mkldnn
    if dtype == torch.bfloat16:
        return bool(mkldnn._is_mkldnn_bf16_supported())
    return bool(mkldnn._is_mkldnn_fp16_supported())


def pack_weight(weight: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """Dense CPU [N, K] -> the same weight packed: for the AMX tile kernel where it supports
    the weight (`gated`: a SwiGLU [gate | up] weight, packed for `linear_swiglu`), else in
    oneDNN's layout ([N, K], opaque)."""
    if weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"pack_weight takes a 2-D CPU weight, got {tuple(weight.shape)} on {weight.device}")
    if gated and gemm.supports_gated(weight):
        return gemm.pack_gated(weight)
    if gemm.supports(weight):
        return gemm.pack(weight)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _ROWS_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T + bias, for a dense or packed weight."""
    if gemm.is_packed(weight):
        return gemm.linear(x, weight, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def linear_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of x [..., K] @ [gate | up] [2I, K]^T + bias -> [..., I]: in one kernel
    for a gated AMX packing, else the linear then silu_and_mul."""
    if gemm.is_packed_gated(weight):
        return gemm.linear_swiglu(x, weight, bias)
    return silu_and_mul(linear(x, weight, bias))


def is_packed(weight: torch.Tensor) -> bool:
    return weight.is_mkldnn or gemm.is_packed(weight) or gemm.is_packed_gated(weight)


def pack_module_weights(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace the dense `weight` of every module of `model` that declares
    `packable_weight = True` by its packed copy. A weight tied to another module (an LM head
    sharing the embedding) is packed into a copy of its own, the other keeps the dense one.
    A module that also declares `packs_gated = True` holds a SwiGLU [gate | up] weight and
    multiplies with `linear_swiglu`. Returns how many weights were packed: 0 when `dtype` or
    this CPU cannot pack; weights already packed, or of another dtype or device, are left as
    they are."""
    if not cpu_packing_supported(dtype):
        return 0
    packed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None) if getattr(module, "packable_weight", False) else None
        if weight is None or is_packed(weight) or weight.dtype != dtype or weight.device.type != "cpu":
            continue
        gated = getattr(module, "packs_gated", False)
        module.weight = nn.Parameter(pack_weight(weight, gated=gated), requires_grad=False)
        packed += 1
    return packed


class PackableLinear(nn.Linear):
    """An nn.Linear that `pack_module_weights` may pack for serving on CPU; until then (and in
    training, and on every other device) it is exactly nn.Linear."""

    packable_weight = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
