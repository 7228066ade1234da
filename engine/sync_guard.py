"""The guard of docs/design.md §4: inside `with SyncGuard(device):` any host/device
synchronisation fails loudly, except the one wait per step the engine designates.

    with SyncGuard(device) as guard:
        for step in steps:
            launch(step)
            with guard.permitted("previous step's output tokens"):
                previous_event.synchronize(); tokens = pinned_out.tolist()
    assert guard.waits == len(steps)

- CUDA / ROCm: `torch.cuda.set_sync_debug_mode("error")` for the scope; torch itself raises
  (RuntimeError "called a synchronizing CUDA operation") on the first blocking call.
- CPU: nothing really waits, so the guard names the operations that would: a
  `TorchDispatchMode` sees every aten op (`.item()`, `nonzero`, boolean-mask indexing,
  `unique`, `repeat_interleave` without `output_size`, ...) and a `TorchFunctionMode` sees
  the Python-level reads that never reach the dispatcher (`.tolist()`, `.numpy()`,
  `.cpu()`, `.to("cpu")`). Both raise `HostSyncError` saying what to do instead.

Tensor creation from host data (`torch.tensor(list)`, `torch.from_numpy`, `pinned.copy_`),
host -> device copies and every fixed-shape op pass. `.to("cpu", non_blocking=True)` also
passes: torch gives it a pinned destination and does not wait (the caller must wait for an
event before reading it). The modes are thread-local: they watch the thread that entered.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncError", "SyncGuard"]

_PERMIT_HINT = "If this is the step's one designated wait, wrap it in `with guard.permitted(reason):`."


class HostSyncError(RuntimeError):
    """An operation that makes the host wait for the device ran inside a SyncGuard."""


def _fail(op: str, why: str, fix: str) -> None:
    raise HostSyncError(f"{op} inside SyncGuard: {why}. Fix: {fix}. {_PERMIT_HINT}")


_READ_BACK = (
    "reads device data on the host, which waits for all queued device work",
    "keep the value on the device (torch.where, clamp, masks), or read it one step later "
    "from a pinned copy made with non_blocking=True",
)
_COPY_BACK = (
    "copies device -> host and waits for it",
    "copy into a preallocated pinned buffer with `pinned.copy_(t, non_blocking=True)`, record "
    "an event, and read the buffer after that event one step later",
)
_DATA_SHAPE = (
    "its output shape depends on tensor values, so the host must read them back",
    "keep the shape fixed: torch.where(cond, a, b), masked_fill, multiply by the mask, or "
    "nonzero_static(size=<host bound>)",
)
_HOST_BOOL = (
    "returns a Python bool computed from device data",
    "compare on the device and keep the result a tensor (torch.eq(a, b).all())",
)
_UNIQUE = (
    "its output size is the number of distinct values",
    "scatter into a fixed-size buffer (zeros(n).scatter_add_ / scatter_reduce_)",
)
_COUNT = (
    "its output length is max(input) + 1, read back from the device",
    "counts = zeros(n).scatter_add_(0, idx, ones_like(idx)) with a host-known n",
)
_REPEAT = (
    "without output_size the total length is read back from the device",
    "pass output_size=<host-known sum of repeats>",
)


def _is_bool_index(index: object) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _target_is_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether Tensor.to(...) names the CPU as its device (dtype-only calls do not)."""
    candidates = [*args[1:], kwargs.get("device")]
    for candidate in candidates:
        if isinstance(candidate, (str, torch.device)):
            return torch.device(candidate).type == "cpu"
    return False


class _Checks:
    """What both modes do with an intercepted op: unless a permitted wait is in progress, fail
    if its key is in `simple` (ops that always wait) or if `_check_args` finds that these
    arguments make it wait; then run it."""

    guard: SyncGuard
    simple: dict[Any, tuple[str, tuple[str, str]]]  # key -> (op, (why, fix))

    def _run_checked(self, func: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
        kwargs = kwargs or {}
        if not self.guard.suspended:
            found = self.simple.get(key)
            if found is not None:
                _fail(found[0], *found[1])
            self._check_args(func, args, kwargs)
        return func(*args, **kwargs)

    def _check_args(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise NotImplementedError


class _FunctionChecks(_Checks, TorchFunctionMode):
    """Python-level entry points: reads that bypass the dispatcher, and clearer names for
    ops the dispatch mode would also catch."""

    def __init__(self, guard: SyncGuard) -> None:
        super().__init__()
        self.guard = guard
        t = torch.Tensor
        simple: dict[Callable[..., Any], tuple[str, tuple[str, str]]] = {
            t.tolist: (".tolist()", _COPY_BACK),
            t.numpy: (".numpy()", _COPY_BACK),
            t.__array__: ("numpy conversion (np.asarray(tensor))", _COPY_BACK),
            t.cpu: (".cpu()", _COPY_BACK),
            t.item: (".item()", _READ_BACK),
            t.__bool__: ("bool(tensor) (e.g. `if tensor:`)", _READ_BACK),
            t.__int__: ("int(tensor)", _READ_BACK),
            t.__float__: ("float(tensor)", _READ_BACK),
            t.__index__: ("tensor used as a Python index", _READ_BACK),
            t.__repr__: ("printing a tensor (repr / str)", _COPY_BACK),
            t.__format__: ("formatting a tensor (f-string / format)", _COPY_BACK),
            torch.nonzero: ("torch.nonzero", _DATA_SHAPE),
            t.nonzero: (".nonzero()", _DATA_SHAPE),
            torch.argwhere: ("torch.argwhere", _DATA_SHAPE),
            t.argwhere: (".argwhere()", _DATA_SHAPE),
            torch.masked_select: ("torch.masked_select", _DATA_SHAPE),
            t.masked_select: (".masked_select()", _DATA_SHAPE),
            torch.unique: ("torch.unique", _UNIQUE),
            t.unique: (".unique()", _UNIQUE),
            torch.unique_consecutive: ("torch.unique_consecutive", _UNIQUE),
            t.unique_consecutive: (".unique_consecutive()", _UNIQUE),
            torch.bincount: ("torch.bincount", _COUNT),
            t.bincount: (".bincount()", _COUNT),
            torch.equal: ("torch.equal", _HOST_BOOL),
            t.equal: (".equal()", _HOST_BOOL),
            torch.allclose: ("torch.allclose", _HOST_BOOL),
            t.allclose: (".allclose()", _HOST_BOOL),
        }
        self.simple = simple

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self._run_checked(func, func, args, kwargs)

    def _check_args(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if func is torch.Tensor.to and not kwargs.get("non_blocking", False) and _target_is_cpu(args, kwargs):
            _fail('.to("cpu")', *_COPY_BACK)
        if func is torch.where and len(args) + len(kwargs) == 1:
            _fail("torch.where(condition) with one argument", *_DATA_SHAPE)
        if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if len(args) == 1 and func is torch.repeat_interleave and "repeats" not in kwargs:
                repeats = args[0]  # torch.repeat_interleave(repeats): the repeats are the input
            if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None and len(args) < 4:
                _fail("repeat_interleave with tensor repeats", *_REPEAT)


def _packet(name: str) -> Any:
    return getattr(torch.ops.aten, name, None)


class _DispatchChecks(_Checks, TorchDispatchMode):
    """Every aten op that would block on a GPU, whatever Python route reached it."""

    _SIMPLE = {
        "_local_scalar_dense": (
            "a tensor read as a Python number (.item(), int(), float(), bool())",
            _READ_BACK,
        ),
        "is_nonzero": ("bool(tensor)", _READ_BACK),
        "equal": ("aten::equal", _HOST_BOOL),
        "nonzero": ("aten::nonzero (nonzero / argwhere / where(cond))", _DATA_SHAPE),
        "masked_select": ("aten::masked_select", _DATA_SHAPE),
        "_unique": ("aten::_unique (torch.unique)", _UNIQUE),
        "_unique2": ("aten::_unique2 (torch.unique)", _UNIQUE),
        "unique_dim": ("aten::unique_dim (torch.unique(dim=))", _UNIQUE),
        "unique_consecutive": ("aten::unique_consecutive", _UNIQUE),
        "unique_dim_consecutive": ("aten::unique_dim_consecutive", _UNIQUE),
        "bincount": ("aten::bincount", _COUNT),
        "_to_sparse": ("dense -> sparse conversion", _DATA_SHAPE),
        "to_sparse": ("dense -> sparse conversion", _DATA_SHAPE),
    }

    def __init__(self, guard: SyncGuard) -> None:
        super().__init__()
        self.guard = guard
        self.simple = {p: v for name, v in self._SIMPLE.items() if (p := _packet(name)) is not None}
        self.indexing = {p for n in ("index", "_unsafe_index") if (p := _packet(n)) is not None}
        self.index_put = {
            p
            for n in ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put")
            if (p := _packet(n)) is not None
        }

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self._run_checked(func, func.overloadpacket, args, kwargs)

    def _check_args(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        packet = func.overloadpacket
        if packet in self.indexing and any(_is_bool_index(i) for i in _indices(args, kwargs)):
            _fail("boolean-mask indexing (tensor[mask])", *_DATA_SHAPE)
        if packet in self.index_put and any(_is_bool_index(i) for i in _indices(args, kwargs)):
            _fail(
                "boolean-mask assignment (tensor[mask] = value)",
                "on a GPU it runs nonzero on the mask",
                "tensor.masked_fill_(mask, value) or torch.where(mask, value, tensor)",
            )
        if (
            packet is torch.ops.aten.repeat_interleave
            and func._overloadname == "Tensor"
            and kwargs.get("output_size", args[1] if len(args) > 1 else None) is None
        ):
            _fail("repeat_interleave with tensor repeats", *_REPEAT)
        if packet is torch.ops.aten.histc:
            low = kwargs.get("min", args[2] if len(args) > 2 else 0)
            high = kwargs.get("max", args[3] if len(args) > 3 else 0)
            if low == high:
                _fail(
                    "histc with min == max",
                    "the range is read back from the device",
                    "pass explicit min < max",
                )


def _indices(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    indices = kwargs.get("indices", args[1] if len(args) > 1 else ())
    return list(indices or ())


class SyncGuard:
    """Fails on host/device synchronisation in its scope (see the module docstring).

    `permitted(reason)` lets the designated wait through and counts it: `waits` is the
    number of permitted waits so far and `wait_reasons` counts them by reason.
    """

    def __init__(self, device: torch.device | str | None = None, *, enabled: bool = True) -> None:
        self.device = torch.device(device if device is not None else "cpu")
        self.enabled = enabled
        self.waits = 0
        self.wait_reasons: Counter[str] = Counter()
        self._suspended = 0
        self._stack: contextlib.ExitStack | None = None
        self._previous_cuda_mode: int | None = None

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def suspended(self) -> bool:
        return self._suspended > 0

    def __enter__(self) -> SyncGuard:
        if self._stack is not None:
            raise RuntimeError("SyncGuard is not re-entrant; create one per scope")
        if self.enabled and self.on_gpu and not torch.cuda.is_available():
            raise RuntimeError(f"SyncGuard({self.device}) needs CUDA/ROCm, which is not available")
        self._stack = contextlib.ExitStack()
        if not self.enabled:
            return self
        if self.on_gpu:
            self._previous_cuda_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            self._stack.callback(torch.cuda.set_sync_debug_mode, self._previous_cuda_mode)
        else:
            self._stack.enter_context(_FunctionChecks(self))
            self._stack.enter_context(_DispatchChecks(self))
        return self

    def __exit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    @contextlib.contextmanager
    def permitted(self, reason: str) -> Iterator[None]:
        """The one blocking wait of a step (e.g. on the previous step's output copy event)."""
        self.waits += 1
        self.wait_reasons[reason] += 1
        self._suspended += 1
        restore_cuda = self.enabled and self.on_gpu and self._stack is not None
        if restore_cuda:
            torch.cuda.set_sync_debug_mode(self._previous_cuda_mode or 0)
        try:
            yield
        finally:
            self._suspended -= 1
            if restore_cuda and not self._suspended:
                torch.cuda.set_sync_debug_mode("error")

    allow = permitted

    def reset_counts(self) -> None:
        self.waits = 0
        self.wait_reasons.clear()
