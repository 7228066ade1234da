"""The request → slot table: row r, column p holds the slot id of request r's position p.

The host owns it (a numpy mirror it writes and reads freely); the device copy is what the
attention kernels read. Host writes reach the device as non-blocking copies, ordered on the
compute stream before the next forward, so a row may be reused as soon as the host frees it.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.runner.h2d import copy_into


class ReqToTokenTable:
    """`max_rows` rows for requests plus one padding row (`padding_row`) whose every position
    is the pools' sink slot: fixed-size batches (CUDA graph buckets) fill unused entries with
    it, so their reads and writes stay inside the pools and touch nothing live."""

    def __init__(self, max_rows: int, max_context: int, device: torch.device, sink_slot: int) -> None:
        self.max_rows = max_rows
        self.max_context = max_context
        self.padding_row = max_rows
        self.host = np.full((max_rows + 1, max_context), -1, dtype=np.int32)
        self.host[self.padding_row] = sink_slot
        self.device_table = torch.from_numpy(self.host.copy()).to(device)
        self._free_rows = list(range(max_rows - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free_row(self, row: int) -> None:
        self.host[row, :] = -1
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: np.ndarray) -> None:
        """Positions [start, start + len(slots)) of `row` now live in `slots`."""
        end = start + len(slots)
        if end > self.max_context:
            raise ValueError(f"request needs {end} positions, the table holds {self.max_context}")
        self.host[row, start:end] = slots
        copy_into(self.device_table[row, start:end], self.host[row, start:end])

    def slots(self, row: int, start: int, end: int) -> np.ndarray:
        return self.host[row, start:end]
