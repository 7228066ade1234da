"""ctypes bindings of quant_gemm.c: fp32 linear layers and embedding lookups on GGUF
block-quantized weights, dequantised inside the kernel; and their torch references.

A quantized weight is the file's own bytes, a uint8 tensor [N, K / 32 * block_bytes]: row n is
the K / 32 blocks of output feature n, in the GGUF block format named beside it (`FORMATS`).
`linear_q(x, weight, fmt)` is x [..., K] fp32 @ dequant(weight)[N, K]^T; `embedding_q(ids,
weight, fmt)` dequantises the looked-up rows only. Each dequantised value equals
gguf.quants.dequantize's bit for bit; the product differs from `linear_q_torch` (F.linear on the
dequantised matrix) only in the order of its fp32 sums.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.kernels.cpu.build import bind, load

BLOCK = 32  # weights per block (quant_gemm.c)


@dataclass(frozen=True)
class BlockFormat:
    name: str  # GGML's name of the type, as gguf.GGMLQuantizationType spells it
    block_bytes: int  # bytes per block of 32 weights

    def row_bytes(self, k: int) -> int:
        if k % BLOCK:
            raise ValueError(f"{self.name}: a row of {k} weights is not a whole number of {BLOCK}-weight blocks")
        return k // BLOCK * self.block_bytes

    def row_length(self, row_bytes: int) -> int:
        """K of a row of `row_bytes` bytes."""
        return row_bytes // self.block_bytes * BLOCK


@dataclass(frozen=True, repr=False)
class BlockTensor:
    """A GGUF tensor kept in its block format, as a loader hands it to a quantized layer."""

    fmt: str  # a key of FORMATS
    data: torch.Tensor  # uint8 [N, K / 32 * block_bytes], row n = the blocks of output feature n

    def __repr__(self) -> str:
        return f"BlockTensor({self.fmt}, {tuple(self.data.shape)})"


# The formats with a kernel. Q8_0: fp16 scale, 32 int8. Q4_1: fp16 scale and minimum, 32 nibbles.
FORMATS = {name: BlockFormat(name, size) for name, size in (("Q8_0", 34), ("Q4_1", 20))}

_P, _I, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def _functions() -> dict[str, Callable[..., int]] | None:
    library = load("quant_gemm")
    if library is None:
        return None
    functions: dict[str, Callable[..., int]] = {}
    for name in FORMATS:
        suffix = name.lower()
        # x, ldx, qweight, bias, out, ldo, m, n, k, threads -> 0, -1 out of memory, -2 k % 32
        # (swiglu: n is inter, the weight [gate | up] of 2 inter rows)
        for kind in ("linear", "swiglu"):
            functions[f"{kind}_{name}"] = bind(
                library, f"{kind}_{suffix}", [_P, _I, _P, _P, _P, _I, _I, _I, _I, _N], _N
            )
        # qweight, ids, count, out, ldo, k, threads -> 0, -2 k % 32
        functions[f"rows_{name}"] = bind(library, f"dequant_rows_{suffix}", [_P, _P, _I, _P, _I, _I, _N], _N)
    return functions


def available() -> bool:
    return _functions() is not None


def function_address(fmt: str, swiglu: bool = False) -> int:
    """The address of quant_gemm.c's `linear_<fmt>` (or `swiglu_<fmt>`): kernel_signatures.h's linear_fn."""
    functions = _functions()
    if functions is None:
        raise RuntimeError("the quantized CPU kernels are not built here")
    # a ctypes function object behind the Callable type
    function: Any = functions[f"{'swiglu' if swiglu else 'linear'}_{fmt}"]
    address = ctypes.cast(function, ctypes.c_void_p).value
    assert address is not None
    return address


def _checked(fmt: str, weight: torch.Tensor) -> tuple[Callable[..., int], Callable[..., int], int]:
    """(linear, row lookup) of `fmt` and K of `weight`, which must be its [N, row_bytes] uint8."""
    functions = _functions()
    if functions is None:
        raise RuntimeError("the quantized CPU kernels are not built here (no C compiler, or DSPARK_CPU_KERNELS)")
    block = FORMATS[fmt]
    if weight.dtype != torch.uint8 or weight.dim() != 2 or weight.shape[1] % block.block_bytes or weight.is_cuda:
        raise ValueError(f"{fmt} weight must be a CPU uint8 [N, K / 32 * {block.block_bytes}], got {weight.shape}")
    if not weight.is_contiguous():
        raise ValueError(f"{fmt} weight must be contiguous (whole rows of blocks)")
    return functions[f"linear_{fmt}"], functions[f"rows_{fmt}"], block.row_length(weight.shape[1])


def linear_q(
    x: torch.Tensor, weight: torch.Tensor, fmt: str, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] fp32 @ dequant(weight [N, row_bytes] in `fmt`)^T (+ bias [N] fp32) -> [..., N]
    fp32; into `out` [M, N] (a column slice of a wider tensor is fine) for 2-D x if given."""
    linear, _, k = _checked(fmt, weight)
    n = weight.shape[0]
    if x.dtype != torch.float32 or x.shape[-1] != k:
        raise ValueError(f"linear_q: input {tuple(x.shape)} {x.dtype} does not fit a {fmt} weight with K = {k}")
    rows = x if x.dim() == 2 else x.reshape(-1, k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32)
    elif out.shape != (m, n) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"linear_q: out must be fp32 [{m}, {n}] with unit column stride, got {tuple(out.shape)}")
    bias_ptr = 0
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
        bias_ptr = bias.data_ptr()
    status = linear(
        rows.data_ptr(), rows.stride(0), weight.data_ptr(), bias_ptr, out.data_ptr(), out.stride(0), m, n, k,
        torch.get_num_threads(),
    )  # fmt: skip
    if status:
        raise MemoryError(f"linear_q: no memory for the dequantisation buffers ({fmt}, K = {k})")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n)


def embedding_q(ids: torch.Tensor, weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """ids [...] int64 (each in [0, N)) -> the dequantised rows [..., K] fp32."""
    _, rows, k = _checked(fmt, weight)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty((flat.numel(), k), dtype=torch.float32)
    if flat.numel():
        rows(weight.data_ptr(), flat.data_ptr(), flat.numel(), out.data_ptr(), k, k, torch.get_num_threads())
    return out.view(*ids.shape, k)


def dequantize_torch(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """The reference dequantisation: gguf.quants on the bytes -> [N, K] fp32."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    values = dequantize(weight.numpy(), GGMLQuantizationType[fmt])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def linear_q_torch(x: torch.Tensor, weight: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear_q's reference: F.linear on the dequantised weight."""
    return F.linear(x, dequantize_torch(weight, fmt), bias)


def embedding_q_torch(ids: torch.Tensor, weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """embedding_q's reference: the looked-up rows of the dequantised table."""
    return F.embedding(ids, dequantize_torch(weight, fmt))
