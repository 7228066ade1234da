"""Linear layers on CPU with weights packed once for oneDNN.

`F.linear` on a CPU bf16/fp16 weight lays the weight out for the matrix unit (AMX, AVX512-BF16)
on every call. In decode, a few rows meet every weight of the model once per step, so that
copy costs about as much as the product itself. Packing each weight once at start-up
(`mkldnn._reorder_linear_weight`) and multiplying with `mkldnn._linear_pointwise` removes it;
on 2-D inputs (what the model passes) the result is bit-identical to F.linear. The packed
weight replaces the dense one (an opaque oneDNN tensor that keeps shape and dtype), so memory
does not grow.

Measured on the 2-core Intel Xeon VM with AMX-BF16 (benchmarks/cpu_packed_linear.py), all of
SmolLM2-135M's linear weights once each, weights streamed from DRAM: bf16 packed is 1.25-1.54x
dense at 1-16 rows, and an engine step 1.17-1.24x. float32 weights stay dense: packed they
are faster at 8-16 rows but slower at one row (0.88x).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """Dense CPU [N, K] -> the same weight in oneDNN's packed layout ([N, K], opaque)."""
    if weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"pack_weight takes a 2-D CPU weight, got {tuple(weight.shape)} on {weight.device}")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _ROWS_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T + bias: through oneDNN when `weight` is packed, else F.linear."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def pack_module_weights(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace the dense `weight` of every module of `model` that declares
    `packable_weight = True` by its packed copy. A weight tied to another module (an LM head
    sharing the embedding) is packed into a copy of its own, the other keeps the dense one.
    Returns how many weights were packed: 0 when `dtype` or this CPU cannot pack; weights
    already packed, or of another dtype or device, are left as they are."""
    if not cpu_packing_supported(dtype):
        return 0
    packed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None) if getattr(module, "packable_weight", False) else None
        if weight is None or weight.is_mkldnn or weight.dtype != dtype or weight.device.type != "cpu":
            continue
        module.weight = nn.Parameter(pack_weight(weight), requires_grad=False)
        packed += 1
    return packed


class PackableLinear(nn.Linear):
    """An nn.Linear that `pack_module_weights` may pack for serving on CPU; until then (and in
    training, and on every other device) it is exactly nn.Linear."""

    packable_weight = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
