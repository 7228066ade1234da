"""ctypes bindings of gemm.c: bf16 linear layers on the CPU's matrix unit (Intel AMX).

`pack(weight)` turns a dense [N, K] bf16 weight into the tile layout, a plain bf16 tensor of
shape [N / 32, K / 2, 32, 2] (panels of 32 output columns, pair-interleaved along K), so the
shape alone says what it holds; `linear(x, packed, bias)` multiplies by it. `supports(weight)`
says whether a weight can take this path: the library is built for a CPU with AMX-BF16 (and
`DSPARK_CPU_ISA` does not cap it below `amx`, isa.py), Linux granted the tile registers, the
weight is CPU bf16 and both of its dims are multiples of 32.

A SwiGLU gate/up weight [gate | up] ([2I, K]) can be packed gated instead (`pack_gated`):
each panel holds 16 gate columns and their 16 up columns, shape [I / 16, K / 2, 2, 16, 2], and
`linear_swiglu` returns silu(gate) * up [..., I] straight from the sums, rounded where the
separate linear, silu and product round (engine/kernels/activation.py), so the [..., 2I]
intermediate is never written.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from engine.kernels.cpu import isa, weight_memory
from engine.kernels.cpu.build import bind, load

PANEL = 32  # output columns per panel (gemm.c)
K_MULTIPLE = 32  # K of one tile row (gemm.c's K_BLOCK)
GATED_COLUMNS = 16  # gate (and up) columns per panel of a gated packing

_P, _I, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def _functions() -> dict[str, Callable[..., int]] | None:
    if not isa.target().allows("amx"):
        return None  # capped below AMX (isa.py): the tile kernels stay off
    library = load("gemm")
    if library is None or not bind(library, "amx_supported", [], _N)():
        return None
    if bind(library, "amx_init", [], _N)() != 0:
        return None  # the kernel refused this process the tile state
    return {
        # weight, ldw, packed, n, k, threads
        "pack": bind(library, "pack_weight_bf16", [_P, _I, _P, _I, _I, _N]),
        # x, ldx, packed, bias, out, ldo, m, n, k, threads -> 0, or -1 out of memory
        "linear": bind(library, "linear_bf16", [_P, _I, _P, _P, _P, _I, _I, _I, _I, _N], _N),
        # x, ldx, packed, bias, out, ldo, m, inter, k, threads -> 0, or -1 out of memory
        "linear_swiglu": bind(library, "linear_swiglu_bf16", [_P, _I, _P, _P, _P, _I, _I, _I, _I, _N], _N),
    }


def available() -> bool:
    return _functions() is not None


def supports(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[0] % PANEL == 0
        and weight.shape[1] % K_MULTIPLE == 0
        and available()
    )


def is_packed(weight: torch.Tensor) -> bool:
    return weight.dim() == 4 and weight.shape[2:] == (PANEL, 2)


def supports_gated(weight: torch.Tensor) -> bool:
    return supports(weight) and weight.shape[0] % (2 * GATED_COLUMNS) == 0


def is_packed_gated(weight: torch.Tensor) -> bool:
    return weight.dim() == 5 and weight.shape[2:] == (2, GATED_COLUMNS, 2)


def pack_gated(weight: torch.Tensor) -> torch.Tensor:
    """Dense CPU bf16 [gate | up] [2I, K] (supports_gated) -> packed [I / 16, K / 2, 2, 16, 2]."""
    if not supports_gated(weight):
        raise ValueError(f"cannot pack a {weight.dtype} gate/up weight of shape {tuple(weight.shape)} for AMX here")
    two_inter, k = weight.shape
    blocks = two_inter // (2 * GATED_COLUMNS)
    interleaved = weight.detach().reshape(2, blocks, GATED_COLUMNS, k).transpose(0, 1).reshape(two_inter, k)
    return pack(interleaved).view(blocks, k // 2, 2, GATED_COLUMNS, 2)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """Dense CPU bf16 [N, K] (supports(weight)) -> packed [N / 32, K / 2, 32, 2]."""
    if not supports(weight):
        raise ValueError(f"cannot pack a {weight.dtype} weight of shape {tuple(weight.shape)} for AMX here")
    functions = _functions()
    assert functions is not None
    n, k = weight.shape
    weight = weight.detach()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    packed = weight_memory.empty((n // PANEL, k // 2, PANEL, 2), torch.bfloat16)
    functions["pack"](weight.data_ptr(), weight.stride(0), packed.data_ptr(), n, k, torch.get_num_threads())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] bf16 @ the packed weight's [N, K]^T (+ bias [N]) -> [..., N] bf16."""
    return _call("linear", x, packed, bias, packed.shape[0] * PANEL)


def linear_swiglu(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] bf16, a gated packing of [gate | up] [2I, K] (+ bias [2I]) -> silu(gate) * up
    [..., I] bf16."""
    return _call("linear_swiglu", x, packed, bias, packed.shape[0] * GATED_COLUMNS)


def _call(
    name: str, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_columns: int
) -> torch.Tensor:
    """gemm.c's `name`_bf16 on the rows of x; its n argument is the output's width (the
    weight's N, or I of a gated weight). Runs once per linear layer per step: the common case
    (2-D rows, no bias) takes no reshape and no copy."""
    functions = _functions()
    assert functions is not None, "pack() the weight first"
    k = packed.shape[1] * 2
    if x.dtype != torch.bfloat16 or x.shape[-1] != k:
        raise ValueError(f"{name}: input {tuple(x.shape)} {x.dtype} does not fit a bf16 weight with K = {k}")
    rows = x if x.dim() == 2 else x.reshape(-1, k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    bias_ptr = 0
    if bias is not None:
        bias = bias.to(torch.bfloat16).contiguous()
        bias_ptr = bias.data_ptr()
    m = rows.shape[0]
    out = torch.empty((m, out_columns), dtype=torch.bfloat16)
    if m and functions[name](
        rows.data_ptr(), rows.stride(0), packed.data_ptr(), bias_ptr, out.data_ptr(), out_columns, m, out_columns, k,
        torch.get_num_threads(),
    ):  # fmt: skip
        raise MemoryError(f"{name}: no memory for a padded copy of a {tuple(rows.shape)} input")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out_columns)
