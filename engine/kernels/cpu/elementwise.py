"""ctypes bindings of elementwise.c: RMSNorm (with or without the residual add), silu-and-mul
and the RoPE rotation, one pass each on CPU tensors of bf16 or fp32.

Each function returns new contiguous tensors, as its torch reference does, and rounds where
that reference rounds (tests/cpu_kernels/test_cpu_elementwise.py compares them).
`available(...)` says whether a call can take this path: the library is built, the tensors
are CPU bf16/fp32 with a contiguous last dim, and autograd need not record the op.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from engine.kernels.cpu.build import bind, load

_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    # x, x_stride, residual, residual_stride, weight, out, residual_out, rows, n, eps, threads
    "rms_norm": [_P, _I, _P, _I, _P, _P, _P, _I, _I, _F, _N],
    # x, x_stride, out, rows, inter, threads
    "silu_and_mul": [_P, _I, _P, _I, _I, _N],
    # x, x_stride_t, x_stride_h, cos, sin, out, tokens, heads, head_dim, rope_dim, threads
    "rope": [_P, _I, _I, _P, _P, _P, _I, _I, _I, _I, _N],
}
_SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}


@functools.cache
def _functions() -> dict[tuple[str, torch.dtype], Callable[..., None]] | None:
    library = load("elementwise")
    if library is None:
        return None
    return {
        (name, dtype): bind(library, f"{name}_{suffix}", argtypes)
        for name, argtypes in _SIGNATURES.items()
        for dtype, suffix in _SUFFIXES.items()
    }


def available(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """Asked before every elementwise op on CPU (several per layer per step): plain attribute
    checks, cheapest first."""
    dtype = x.dtype
    if not x.is_cpu or dtype not in _SUFFIXES or x.dim() < 2 or x.stride(-1) != 1:
        return False
    for t in others:
        if t.dtype != dtype or not t.is_cpu or t.stride(-1) != 1:
            return False
    if torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in others)):
        return False
    return _functions() is not None


def _function(name: str, dtype: torch.dtype) -> Callable[..., None]:
    functions = _functions()
    assert functions is not None, "call available() first"
    return functions[(name, dtype)]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, N] (rows may be strided), weight [N] -> normed [T, N]."""
    out = torch.empty(x.shape, dtype=x.dtype)
    _rms_norm(x, weight, eps, out, None, None)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [T, N], weight [N] -> (rms_norm(x + residual), x + residual), both [T, N]."""
    out = torch.empty(x.shape, dtype=x.dtype)
    residual_out = torch.empty(x.shape, dtype=x.dtype)
    _rms_norm(x, weight, eps, out, residual, residual_out)
    return out, residual_out


def _rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual: torch.Tensor | None,  # None: plain RMSNorm
    residual_out: torch.Tensor | None,  # where x + residual goes, with residual
) -> None:
    rows, n = x.shape
    _function("rms_norm", x.dtype)(
        x.data_ptr(), x.stride(0),
        0 if residual is None else residual.data_ptr(), 0 if residual is None else residual.stride(0),
        weight.contiguous().data_ptr(), out.data_ptr(), 0 if residual_out is None else residual_out.data_ptr(),
        rows, n, eps, torch.get_num_threads(),
    )  # fmt: skip


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] laid [gate | up] -> [T, I]."""
    rows, width = x.shape
    out = torch.empty((rows, width // 2), dtype=x.dtype)
    _function("silu_and_mul", x.dtype)(
        x.data_ptr(), x.stride(0), out.data_ptr(), rows, width // 2, torch.get_num_threads()
    )
    return out


def rope(
    x: torch.Tensor,  # [T, H, D], heads may be strided
    cos: torch.Tensor,  # [T, 1, rope_dim] ([c | c], in x's dtype; rope_tables_torch)
    sin: torch.Tensor,  # [T, 1, rope_dim] ([-s | s])
) -> torch.Tensor:  # [T, H, D]
    tokens, heads, head_dim = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype)
    _function("rope", x.dtype)(
        x.data_ptr(), x.stride(0), x.stride(1), cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
        tokens, heads, head_dim, cos.shape[-1], torch.get_num_threads(),
    )  # fmt: skip
    return out
