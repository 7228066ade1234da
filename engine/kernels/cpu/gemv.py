"""ctypes bindings of gemv.c: fp32 and bf16 linear layers on any CPU's vector unit (AVX-512,
AVX2 + FMA, or the portable build; isa.py picks the build for this CPU, `DSPARK_CPU_ISA` caps it).

`pack(weight)` turns a dense [N, K] weight (N a multiple of 32; K even in bf16) into panels of
32 output columns: fp32 [N / 32, K, 32], bf16 [N / 32, K / 2, 32, 2] (the AMX tile kernel's
layout, gemm.py, so one packed bf16 weight serves either kernel); `linear(x, packed, bias)`
multiplies by it, x and the result in the weight's dtype. A SwiGLU [gate | up] weight ([2I, K])
packs gated (`pack_gated`: each panel 16 gate columns then their 16 up columns, fp32
[I / 16, K, 2, 16], bf16 [I / 16, K / 2, 2, 16, 2]) and `linear_swiglu` returns silu(gate) * up
[..., I] straight from the sums, rounded where the separate linear, silu and product round.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from engine.kernels.cpu import weight_memory
from engine.kernels.cpu.build import bind, load

PANEL = 32  # output columns per panel (gemv.c)
GATED_COLUMNS = 16  # gate (and up) columns per panel of a gated packing
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}

_P, _I, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def _functions() -> dict[str, Callable[..., int]] | None:
    library = load("gemv")
    if library is None:
        return None
    functions: dict[str, Callable[..., int]] = {}
    linear_args = [_P, _I, _P, _P, _P, _I, _I, _I, _I, _N]
    for suffix in DTYPES.values():
        # weight, ldw, packed, n, k, threads
        functions[f"pack_{suffix}"] = bind(library, f"gemv_pack_{suffix}", [_P, _I, _P, _I, _I, _N])
        # x, ldx, packed, bias, out, ldo, m, n (or inter), k, threads -> 0
        for name in ("linear", "swiglu"):
            functions[f"{name}_{suffix}"] = bind(library, f"gemv_{name}_{suffix}", linear_args, _N)
    return functions


def available() -> bool:
    return _functions() is not None


@functools.cache
def isa_name() -> str | None:
    """The vector path the library was built with: avx512bf16, avx512, avx2 or portable."""
    library = load("gemv")
    return None if library is None else bind(library, "gemv_isa", [], ctypes.c_char_p)().decode()


def address(dtype: torch.dtype, swiglu: bool = False) -> int:
    """The C function of `linear_swiglu` (swiglu) or `linear` for `dtype` (decoder.c calls it)."""
    library = load("gemv")
    assert library is not None, "check available() first"
    name = f"gemv_{'swiglu' if swiglu else 'linear'}_{DTYPES[dtype]}"
    value = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    assert value is not None
    return value


def supports(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in DTYPES
        and weight.dim() == 2
        and weight.shape[0] % PANEL == 0
        and (weight.dtype == torch.float32 or weight.shape[1] % 2 == 0)
        and available()
    )


def supports_gated(weight: torch.Tensor) -> bool:
    return supports(weight) and weight.shape[0] % (2 * GATED_COLUMNS) == 0


def is_packed(weight: torch.Tensor) -> bool:
    if weight.dtype == torch.bfloat16:
        return weight.dim() == 4 and weight.shape[2:] == (PANEL, 2)
    return weight.dtype == torch.float32 and weight.dim() == 3 and weight.shape[2] == PANEL


def is_packed_gated(weight: torch.Tensor) -> bool:
    if weight.dtype == torch.bfloat16:
        return weight.dim() == 5 and weight.shape[2:] == (2, GATED_COLUMNS, 2)
    return weight.dtype == torch.float32 and weight.dim() == 4 and weight.shape[2:] == (2, GATED_COLUMNS)


def in_features(packed: torch.Tensor) -> int:
    """K of a packed weight, plain or gated."""
    return packed.shape[1] * (2 if packed.dtype == torch.bfloat16 else 1)


def rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [...] of the dense [N, K] weight a plain packing holds -> [..., K]: a tied
    embedding table looked up in the LM head's packing, the values copied exactly."""
    panel, column = ids // PANEL, ids % PANEL
    if packed.dtype == torch.bfloat16:  # [N / 32, K / 2, 32, 2] -> [..., K / 2, 2]
        return packed[panel, :, column, :].flatten(-2)
    return packed[panel, :, column]  # [N / 32, K, 32] -> [..., K]


def pack(weight: torch.Tensor) -> torch.Tensor:
    """Dense CPU [N, K] (supports(weight)) -> packed (module docstring)."""
    if not supports(weight):
        raise ValueError(f"cannot pack a {weight.dtype} weight of shape {tuple(weight.shape)} into panels here")
    functions = _functions()
    assert functions is not None
    n, k = weight.shape
    weight = weight.detach()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    shape = (n // PANEL, k // 2, PANEL, 2) if weight.dtype == torch.bfloat16 else (n // PANEL, k, PANEL)
    packed = weight_memory.empty(shape, weight.dtype)
    functions[f"pack_{DTYPES[weight.dtype]}"](
        weight.data_ptr(), weight.stride(0), packed.data_ptr(), n, k, torch.get_num_threads()
    )
    return packed


def pack_gated(weight: torch.Tensor) -> torch.Tensor:
    """Dense CPU [gate | up] [2I, K] (supports_gated) -> the gated packing (module docstring)."""
    if not supports_gated(weight):
        raise ValueError(f"cannot pack a {weight.dtype} gate/up weight of shape {tuple(weight.shape)} here")
    two_inter, k = weight.shape
    blocks = two_inter // (2 * GATED_COLUMNS)
    interleaved = weight.detach().reshape(2, blocks, GATED_COLUMNS, k).transpose(0, 1).reshape(two_inter, k)
    packed = pack(interleaved)
    if weight.dtype == torch.bfloat16:
        return packed.view(blocks, k // 2, 2, GATED_COLUMNS, 2)
    return packed.view(blocks, k, 2, GATED_COLUMNS)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ the packed weight's [N, K]^T (+ bias [N]) -> [..., N], in the weight's dtype."""
    return _call("linear", x, packed, bias, packed.shape[0] * PANEL)


def linear_swiglu(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], a gated packing of [gate | up] [2I, K] (+ bias [2I]) -> silu(gate) * up [..., I]."""
    return _call("swiglu", x, packed, bias, packed.shape[0] * GATED_COLUMNS)


def _call(
    name: str, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_columns: int
) -> torch.Tensor:
    """gemv.c's `name` on the rows of x; its n argument is the output's width (the weight's N,
    or I of a gated weight). The common case (2-D rows, no bias) takes no reshape and no copy."""
    functions = _functions()
    assert functions is not None, "pack() the weight first"
    k, dtype = in_features(packed), packed.dtype
    if x.dtype != dtype or x.shape[-1] != k:
        raise ValueError(f"{name}: input {tuple(x.shape)} {x.dtype} does not fit a {dtype} weight with K = {k}")
    rows = x if x.dim() == 2 else x.reshape(-1, k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    bias_ptr = 0
    if bias is not None:
        bias = bias.to(dtype).contiguous()
        bias_ptr = bias.data_ptr()
    m = rows.shape[0]
    out = torch.empty((m, out_columns), dtype=dtype)
    if m:
        functions[f"{name}_{DTYPES[dtype]}"](
            rows.data_ptr(), rows.stride(0), packed.data_ptr(), bias_ptr, out.data_ptr(), out_columns, m,
            out_columns, k, torch.get_num_threads(),
        )  # fmt: skip
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out_columns)
