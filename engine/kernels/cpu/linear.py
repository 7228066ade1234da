"""Linear layers on CPU with weights packed once at start-up.

`F.linear` on a CPU bf16/fp16 weight lays the weight out for the matrix unit on every call. In
decode, a few rows meet every weight of the model once per step, so that copy costs about as
much as the product itself, and the product should run at the speed the weights stream from
memory. Each weight is therefore packed once, into panels of 32 output columns that a thread
streams contiguously, and multiplied by one of:

- bf16 on a CPU with AMX, both dims multiples of 32: our tile kernel (`engine/kernels/cpu/gemm.c`,
  a [N / 32, K / 2, 32, 2] tensor). oneDNN's small-M path also costs ~40 us of fixed work per
  call.
- otherwise fp32, or bf16 with N a multiple of 32: our vector kernel (`gemv.c`: AVX-512 with or
  without AVX512-BF16, AVX2 + FMA, or portable C, as isa.py builds it for this CPU), in the
  same bf16 layout (so a weight packed for either kernel serves both), fp32 [N / 32, K, 32].
- otherwise bf16/fp16 that oneDNN supports here: oneDNN's own layout
  (`mkldnn._reorder_linear_weight`, multiplied with `mkldnn._linear_pointwise`; an opaque
  [N, K] tensor, bit-identical to F.linear on the 2-D inputs the model passes).

Our kernels take the MLP's gate/up weight packed gated and return SwiGLU's silu(gate) * up from
the sums (`linear_swiglu`). `kernel_of` names the kernel a packed weight runs on, the same for
the layers' Python forward and the one-call decoder stack (engine/runner/cpu_decoder_stack.py).
The packed weight replaces the dense one, so memory does not grow (packed weights sit on
huge pages, weight_memory.py); a tied embedding reads its rows from the LM head's packing
(`embedding`). Measured on the 2-core
VMs: benchmarks/cpu_packed_linear.py, benchmarks/cpu_kernels.py.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.activation import silu_and_mul
from engine.kernels.cpu import gemm, gemv, weight_memory

ONEDNN_DTYPES = (torch.bfloat16, torch.float16)
# oneDNN picks the packed layout for this many rows; the product is exact for any count.
_ROWS_HINT = 16
# ONEDNN_MAX_CPU_ISA values below the instructions oneDNN's bf16/fp16 linears need
_ONEDNN_CAPS_WITHOUT_HALF = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI"})

Kernel = Literal["amx", "gemv", "onednn", "dense"]


def cpu_packing_supported(dtype: torch.dtype) -> bool:
    """True when weights of `dtype` can be packed here: fp32/bf16 for our kernels (built for
    this CPU), or a dtype oneDNN packs here (`onednn_packing_supported`)."""
    return (dtype in gemv.DTYPES and gemv.available()) or onednn_packing_supported(dtype)


def onednn_packing_supported(dtype: torch.dtype) -> bool:
    """True when oneDNN packs and multiplies `dtype` natively here: a bf16/fp16 dtype that
    oneDNN is built into torch for, which this CPU has the instructions for (else oneDNN would
    emulate them) and which `ONEDNN_MAX_CPU_ISA` does not cap away (torch's support checks read
    the CPU alone, while oneDNN refuses bf16 below AVX512_CORE or AVX2_VNNI_2 when capped)."""
    if dtype not in ONEDNN_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in _ONEDNN_CAPS_WITHOUT_HALF:
        return False
    mkldnn = torch.ops.mkldnn
    if dtype == torch.bfloat16:
        return bool(mkldnn._is_mkldnn_bf16_supported())
    return bool(mkldnn._is_mkldnn_fp16_supported())


def pack_weight(weight: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """Dense CPU [N, K] -> the same weight packed for the first kernel of the module docstring
    that takes it (`gated`: a SwiGLU [gate | up] weight, packed for `linear_swiglu`); the dense
    weight itself where none does (fp32 of an N our panels do not divide)."""
    if weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"pack_weight takes a 2-D CPU weight, got {tuple(weight.shape)} on {weight.device}")
    if gated and gemm.supports_gated(weight):
        return gemm.pack_gated(weight)
    if gemm.supports(weight):
        return gemm.pack(weight)
    if gated and gemv.supports_gated(weight):
        return gemv.pack_gated(weight)
    if gemv.supports(weight):
        return gemv.pack(weight)
    if onednn_packing_supported(weight.dtype):
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _ROWS_HINT)
    return weight


def kernel_of(weight: torch.Tensor) -> Kernel:
    """The kernel that multiplies by `weight` (packed or not). A bf16 panel packing runs on the
    AMX tiles where they are there and take its K, else on the vector kernel."""
    if weight.is_mkldnn:
        return "onednn"
    if not (gemv.is_packed(weight) or gemv.is_packed_gated(weight)):
        return "dense"
    if weight.dtype == torch.bfloat16 and gemm.available() and gemv.in_features(weight) % gemm.K_MULTIPLE == 0:
        return "amx"
    return "gemv"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T + bias, for a dense or packed weight."""
    kernel = kernel_of(weight)
    if kernel == "amx":
        return gemm.linear(x, weight, bias)
    if kernel == "gemv":
        return gemv.linear(x, weight, bias)
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def linear_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of x [..., K] @ [gate | up] [2I, K]^T + bias -> [..., I]: in one kernel
    for a gated packing, else the linear then silu_and_mul."""
    if gemv.is_packed_gated(weight):
        if kernel_of(weight) == "amx":
            return gemm.linear_swiglu(x, weight, bias)
        return gemv.linear_swiglu(x, weight, bias)
    return silu_and_mul(linear(x, weight, bias))


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of an embedding table [V, H], dense or held in a plain panel packing (a
    tied LM head's, see pack_module_weights) -> [..., H]."""
    if gemv.is_packed(weight):
        return gemv.rows(weight, ids)
    return F.embedding(ids, weight)


def is_packed(weight: torch.Tensor) -> bool:
    return kernel_of(weight) != "dense"


def pack_module_weights(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace the dense `weight` of every module of `model` that declares
    `packable_weight = True` by its packed copy. A module tied to it that declares
    `reads_packed_rows = True` (an embedding sharing the LM head's table) gets the same packed
    parameter where the packing is a plain panel one (`embedding` reads rows of it), so the
    table is held once; any other tied module keeps the dense weight. A module that also
    declares `packs_gated = True` holds a SwiGLU [gate | up] weight and multiplies with
    `linear_swiglu`. Returns how many weights were packed: 0 when `dtype` or this CPU cannot
    pack; weights already packed, or of another dtype or device, or that no kernel takes, are
    left as they are."""
    if not cpu_packing_supported(dtype):
        return 0
    holders: dict[int, list[nn.Module]] = {}  # id of a weight -> the modules holding it
    for module in model.modules():
        held = getattr(module, "weight", None)
        if isinstance(held, torch.Tensor):
            holders.setdefault(id(held), []).append(module)
    packed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None) if getattr(module, "packable_weight", False) else None
        if weight is None or is_packed(weight) or weight.dtype != dtype or weight.device.type != "cpu":
            continue
        packed_weight = pack_weight(weight, gated=getattr(module, "packs_gated", False))
        if packed_weight is weight:
            continue
        parameter = nn.Parameter(packed_weight, requires_grad=False)
        module.weight = parameter
        if gemv.is_packed(packed_weight):
            for tied in holders.get(id(weight), []):
                if getattr(tied, "reads_packed_rows", False):
                    tied.weight = parameter
        packed += 1
    if packed:
        weight_memory.release_freed()
    return packed


class PackableLinear(nn.Linear):
    """An nn.Linear that `pack_module_weights` may pack for serving on CPU; until then (and in
    training, and on every other device) it is exactly nn.Linear."""

    packable_weight = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
