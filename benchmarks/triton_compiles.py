"""Triton's in-memory cache misses over a stretch of a benchmark (`triton.knobs.runtime`'s JIT
hooks, Triton >= 3.4). A kernel variant first met inside the timed run (a constexpr or an
argument specialisation that a new load shape selects) is compiled, or read from Triton's disk
cache, on the launching thread: the step that meets it, and every request in it, waits.

A miss that Triton's disk cache serves takes milliseconds; a real compile takes hundreds.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


def _runtime_knobs() -> Any | None:
    try:
        from triton import knobs
    except ImportError:  # no Triton, or one before 3.4 (no knobs)
        return None
    runtime = knobs.runtime
    return runtime if hasattr(runtime, "jit_post_compile_hook") else None


@dataclass
class TritonCompiles:
    """Use as `with TritonCompiles() as compiles:`; read the counts after the block. Hooks set
    by others before the block keep running (they are called first) and are restored after."""

    available: bool = False  # this Triton has the hooks
    misses: int = 0  # variants compiled or loaded from the disk cache inside the block
    total_ms: float = 0.0
    max_ms: float = 0.0
    kernels: Counter[str] = field(default_factory=Counter)  # kernel name -> misses
    _started_s: dict[str, float] = field(default_factory=dict, repr=False)
    _previous: tuple[Any, Any] = field(default=(None, None), repr=False)

    def _before(self, **hook: Any) -> bool | None:
        previous = self._previous[0]
        if previous is not None and previous(**hook):
            return True  # the earlier hook asked Triton to skip this compile
        self._started_s[str(hook["key"])] = time.perf_counter()
        return None

    def _after(self, **hook: Any) -> bool | None:
        previous = self._previous[1]
        if previous is not None:
            previous(**hook)
        started = self._started_s.pop(str(hook["key"]), None)
        if started is not None:
            elapsed_ms = 1e3 * (time.perf_counter() - started)
            self.misses += 1
            self.total_ms += elapsed_ms
            self.max_ms = max(self.max_ms, elapsed_ms)
            self.kernels[hook["fn"].name] += 1
        return None

    def __enter__(self) -> TritonCompiles:
        runtime = _runtime_knobs()
        if runtime is not None:
            self.available = True
            self._previous = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
            runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._before, self._after
        return self

    def __exit__(self, *exc: object) -> None:
        runtime = _runtime_knobs()
        if self.available and runtime is not None:
            runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._previous
