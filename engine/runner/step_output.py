"""A launched step's outputs on their way to the host.

Device → host copies go to pinned buffers on a side stream, behind an event recorded on the
compute stream after the step; `wait()` is the one blocking wait of the step loop and runs
one step later, after the next step has been launched (DESIGN.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class StepResult:
    """Host copies of one step's fixed-shape outputs, one row per scheduled request."""

    tokens: np.ndarray  # [R, W] int64: committed tokens of each row, padded
    accept_len: np.ndarray  # [R] int32: how many of `tokens` each row committed (>= 1)
    kv_len: np.ndarray  # [R] int32: the row's KV length after the step
    logprob: np.ndarray | None  # [R, W] float32: log p of each committed token
    top_ids: np.ndarray | None  # [R, W, N] int64: the N most likely alternatives
    top_logprobs: np.ndarray | None  # [R, W, N] float32
    draft_len: np.ndarray | None = None  # [R] int32: DSpark tokens drafted per row


class PendingStep:
    def __init__(self, device_outputs: dict[str, torch.Tensor], copy_stream: torch.cuda.Stream | None) -> None:
        self._host: dict[str, torch.Tensor] = {}
        self._done: torch.cuda.Event | None = None
        if copy_stream is None:
            # CPU: work already ran in order; a copy detaches the results from reused buffers.
            self._host = {name: t.clone() for name, t in device_outputs.items()}
            return
        ready = torch.cuda.Event()
        ready.record()
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_event(ready)
            for name, t in device_outputs.items():
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                t.record_stream(copy_stream)
                self._host[name] = host
            self._done = torch.cuda.Event()
            self._done.record(copy_stream)

    def wait(self) -> StepResult:
        """Block until the copies landed (the permitted per-step wait) and view them."""
        if self._done is not None:
            self._done.synchronize()
        arrays = {name: t.numpy() for name, t in self._host.items()}
        return StepResult(
            tokens=arrays["tokens"],
            accept_len=arrays["accept_len"],
            kv_len=arrays["kv_len"],
            logprob=arrays.get("logprob"),
            top_ids=arrays.get("top_ids"),
            top_logprobs=arrays.get("top_logprobs"),
            draft_len=arrays.get("draft_len"),
        )
