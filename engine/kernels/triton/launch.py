"""What the Triton launchers of engine.kernels.triton share: triton imported only where it is
installed, kernels jitted at their first launch, and the checks on their tensor arguments.

Jitting at the first launch rather than at import lets TRITON_INTERPRET, set by then, decide
between the interpreter and the GPU compiler, so the kernel tests run them interpreted on CPU
in-process (tests/kernels). Kernels that call triton.language's own jitted functions (tl.sum,
tl.max, tl.cdiv, ...) cannot run interpreted in a process whose triton was first imported
without TRITON_INTERPRET, whenever they are jitted: the attention kernels are therefore
decorated at import and tested in a child process (tests/attention/test_attention_triton.py).

The attention launchers also come as `*_launches` functions that prepare a forward's launches
once (host ints, grids, workspaces) for all its layers (`CacheLaunch`, docs/design.md §4.8).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without the `gpu` extra run the torch references only
    triton = None
    tl = None

__all__ = [
    "CacheLaunch",
    "available",
    "check_last_dim_contiguous",
    "jit_on_first_use",
    "require_triton",
    "tl",
    "triton",
]

# One kernel launch of a forward's attention, its grid and every argument but the KV cache
# prepared once: called with each layer's (k_cache, v_cache), whose strides it reads then.
CacheLaunch = Callable[[torch.Tensor, torch.Tensor], None]


def available() -> bool:
    return triton is not None


def require_triton(op: str) -> None:
    if triton is None:
        raise RuntimeError(f"{op} needs triton (pip install 'dspark-serve[gpu]')")


def jit_on_first_use(kernel: Callable[..., None], **options: Any) -> Callable[[], Any]:
    """A cached factory of `triton.jit(kernel, **options)`: launch as `factory()[grid](...)`;
    `factory.cache_clear()` makes the next launch jit the kernel again (for a new mode)."""

    @functools.cache
    def compiled() -> Any:  # a triton JITFunction
        require_triton(kernel.__name__)
        return triton.jit(kernel, **options)

    return compiled


def check_last_dim_contiguous(op: str, **tensors: torch.Tensor) -> None:
    """The kernels index the last dim as `base + d`: every tensor's last stride must be 1."""
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} must have a contiguous last dim, strides {t.stride()}")
