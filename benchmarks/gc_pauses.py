"""The garbage collector's pauses over a stretch of a benchmark (`gc.callbacks`), to weigh
services/heap.py's freeze: every pause stops each thread of the process, the step loop's too."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GcPauses:
    """Use as `with GcPauses() as pauses:`; the counts are read after the block."""

    full_collections: int = 0  # generation-2 passes
    full_max_ms: float = 0.0
    total_ms: float = 0.0  # every generation's passes
    _started_s: float = field(default=0.0, repr=False)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_s = time.perf_counter()
            return
        pause_ms = 1e3 * (time.perf_counter() - self._started_s)
        self.total_ms += pause_ms
        if info["generation"] == 2:
            self.full_collections += 1
            self.full_max_ms = max(self.full_max_ms, pause_ms)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)
