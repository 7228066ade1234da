"""What the Triton launchers of engine.kernels.triton share: triton imported only where it is
installed, kernels jitted at their first launch, and the checks on their tensor arguments.

Jitting at the first launch rather than at import lets TRITON_INTERPRET, set by then, decide
between the interpreter and the GPU compiler, so the kernel tests run them interpreted on CPU
in-process (tests/kernels). Kernels that call triton.language's own jitted functions (tl.sum,
tl.max, tl.cdiv, ...) cannot run interpreted in a process whose triton was first imported
without TRITON_INTERPRET, whenever they are jitted: the attention kernels are therefore
decorated at import and tested in a child process (tests/attention/test_attention_triton.py).

The attention launchers also come as `*_launches` functions that prepare a forward's launches
once (host ints, grids, workspaces) for all its layers (`CacheLaunch`, docs/design.md §4.8);
`LayerLaunch` then launches every layer after the first straight through the compiled kernel.
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
    "LayerLaunch",
    "available",
    "check_last_dim_contiguous",
    "jit_on_first_use",
    "require_triton",
    "tl",
    "triton",
]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("+")[0].split(".")[:2] if part.isdigit())


# From Triton 3.3 on, a compiled kernel's launcher takes every bound argument, constexprs included.
_LAUNCHER_TAKES_CONSTEXPRS = triton is not None and _version(triton.__version__) >= (3, 3)

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


class LayerLaunch:
    """`kernel[grid]` for the launches a forward prepares once for all its layers (CacheLaunch).

    The first call goes through Triton's JIT, which binds and specialises the arguments and
    finds (or compiles) the kernel; every later call hands its argument list straight to that
    compiled kernel's launcher, skipping the JIT's binding, key and cache lookup on each layer
    (docs/design.md §4.8). Sound because a forward's layers differ only in their KV caches,
    which share one dtype, shape, strides and alignment, so the first call's specialisation
    holds for every layer. Under the interpreter (no compiled kernel) every call is the JIT's.
    """

    __slots__ = ("_jit_launch", "_grid", "_param_names", "_runner", "_trailing")

    def __init__(self, kernel: Any, grid: tuple[int, ...]) -> None:  # kernel: a triton JITFunction
        self._jit_launch = kernel[grid]
        self._grid = (*grid, 1, 1)[:3]
        self._param_names: tuple[str, ...] = tuple(getattr(kernel, "arg_names", ()))
        self._runner: Callable[..., None] | None = None
        self._trailing: tuple[Any, ...] = ()  # the parameters passed by name (constexprs), in order

    @property
    def direct(self) -> bool:
        """Whether calls after the first go straight to the compiled kernel (compiled, not
        interpreted, on Triton >= 3.3)."""
        return self._runner is not None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if self._runner is not None:
            self._runner(*args, *self._trailing)
            return
        compiled = self._jit_launch(*args, **kwargs)
        named = self._param_names[len(args) :]
        if _LAUNCHER_TAKES_CONSTEXPRS and hasattr(compiled, "packed_metadata") and all(n in kwargs for n in named):
            self._trailing = tuple(kwargs[name] for name in named)
            self._runner = compiled[self._grid]


def check_last_dim_contiguous(op: str, **tensors: torch.Tensor) -> None:
    """The kernels index the last dim as `base + d`: every tensor's last stride must be 1."""
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} must have a contiguous last dim, strides {t.stride()}")
