"""A launched step's outputs: the fixed-shape tensors a step writes, and their way to the host.

Device → host copies go to pinned buffers on a side stream, behind an event recorded on the
compute stream after the step; `wait()` is the one blocking wait of the step loop and runs
one step later, after the next step has been launched (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch


class StepLogprobs(NamedTuple):
    """Logprobs of the committed tokens, laid out like `DeviceStepOutput.tokens`."""

    logprob: torch.Tensor  # [R, W] float32: log p of each committed token
    top_ids: torch.Tensor  # [R, W, N] int64: the N most likely alternatives, best first
    top_logprobs: torch.Tensor  # [R, W, N] float32


class PromptLogprobs(NamedTuple):
    """Logprobs of prompt tokens a prefill step scored, chunk after chunk, each chunk's
    `PrefillChunk.prompt_targets` in order (P = the rows of all of them)."""

    logprob: torch.Tensor  # [P] float32: log p of each prompt token at the position before
    top_ids: torch.Tensor  # [P, N] int64: the N most likely tokens there, best first
    top_logprobs: torch.Tensor  # [P, N] float32


class DeviceStepOutput(NamedTuple):
    """One step's fixed-shape outputs, one row per scheduled request (W = 1 outside DSpark)."""

    tokens: torch.Tensor  # [R, W] int64: committed tokens of each row, padded with -1
    accept_len: torch.Tensor  # [R] int32: how many of `tokens` each row committed (0: no sample)
    kv_len: torch.Tensor  # [R] int32: the row's KV length after the step
    logprobs: StepLogprobs | None = None  # when a row of the step asked for logprobs
    draft_len: torch.Tensor | None = None  # [R] int32: DSpark tokens drafted per row
    prompt_logprobs: PromptLogprobs | None = None  # prefill steps with a chunk scoring its prompt

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> DeviceStepOutput:
        """The same outputs with `fn` applied to every tensor (copies, batch cuts)."""
        lp, plp = self.logprobs, self.prompt_logprobs
        return DeviceStepOutput(
            tokens=fn(self.tokens),
            accept_len=fn(self.accept_len),
            kv_len=fn(self.kv_len),
            logprobs=None if lp is None else StepLogprobs(fn(lp.logprob), fn(lp.top_ids), fn(lp.top_logprobs)),
            draft_len=None if self.draft_len is None else fn(self.draft_len),
            prompt_logprobs=None
            if plp is None
            else PromptLogprobs(fn(plp.logprob), fn(plp.top_ids), fn(plp.top_logprobs)),
        )


def _pad(t: torch.Tensor, dim: int, size: int, value: float) -> torch.Tensor:
    """`t` padded with `value` along `dim` up to `size` (host-known shapes only)."""
    if t.shape[dim] == size:
        return t
    shape = list(t.shape)
    shape[dim] = size - shape[dim]
    return torch.cat((t, t.new_full(shape, value)), dim=dim)


def _stack_logprobs(
    first: StepLogprobs | None, rows_first: int, second: StepLogprobs | None, rows_second: int, width: int
) -> StepLogprobs | None:
    """Rows of `first` then `second`, padded to `width` columns and the wider top-N; a side
    without logprobs gets zero rows (no row of it asked)."""
    if first is None and second is None:
        return None
    present = first if first is not None else second
    assert present is not None
    top = max(lp.top_ids.shape[-1] for lp in (first, second) if lp is not None)
    parts = []
    for lp, rows in ((first, rows_first), (second, rows_second)):
        if lp is None:
            lp = StepLogprobs(
                present.logprob.new_zeros((rows, width)),
                present.top_ids.new_zeros((rows, width, top)),
                present.top_logprobs.new_zeros((rows, width, top)),
            )
        parts.append(
            StepLogprobs(
                _pad(lp.logprob, 1, width, 0.0),
                _pad(_pad(lp.top_ids, 1, width, 0), 2, top, 0),
                _pad(_pad(lp.top_logprobs, 1, width, 0.0), 2, top, 0.0),
            )
        )
    return StepLogprobs(*(torch.cat(fields) for fields in zip(*parts, strict=True)))


def concat_rows(decode: DeviceStepOutput, chunks: DeviceStepOutput) -> DeviceStepOutput:
    """A mixed step's outputs: the decode rows' [B, W] then the chunks' [C, 1], the chunks
    padded to W columns with -1 (and draft length 0); prompt logprobs are the chunks'."""
    width = decode.tokens.shape[1]
    rows_d, rows_c = decode.tokens.shape[0], chunks.tokens.shape[0]
    draft_len = None
    if decode.draft_len is not None:
        draft_len = torch.cat((decode.draft_len, decode.draft_len.new_zeros(rows_c)))
    return DeviceStepOutput(
        tokens=torch.cat((decode.tokens, _pad(chunks.tokens, 1, width, -1))),
        accept_len=torch.cat((decode.accept_len, chunks.accept_len)),
        kv_len=torch.cat((decode.kv_len, chunks.kv_len)),
        logprobs=_stack_logprobs(decode.logprobs, rows_d, chunks.logprobs, rows_c, width),
        draft_len=draft_len,
        prompt_logprobs=chunks.prompt_logprobs,
    )


@dataclass(frozen=True)
class StepResult:
    """Host copies of one step's `DeviceStepOutput`."""

    tokens: np.ndarray  # [R, W] int64
    accept_len: np.ndarray  # [R] int32
    kv_len: np.ndarray  # [R] int32
    logprob: np.ndarray | None  # [R, W] float32
    top_ids: np.ndarray | None  # [R, W, N] int64
    top_logprobs: np.ndarray | None  # [R, W, N] float32
    draft_len: np.ndarray | None = None  # [R] int32
    prompt_logprob: np.ndarray | None = None  # [P] float32 (PromptLogprobs' layout)
    prompt_top_ids: np.ndarray | None = None  # [P, N] int64
    prompt_top_logprobs: np.ndarray | None = None  # [P, N] float32


class PendingStep:
    def __init__(self, device_outputs: DeviceStepOutput, copy_stream: torch.cuda.Stream | None) -> None:
        self._done: torch.cuda.Event | None = None
        if copy_stream is None:
            # CPU: work already ran in order; a copy detaches the results from reused buffers.
            self._host = device_outputs.map(torch.clone)
            return
        ready = torch.cuda.Event()
        ready.record()

        def to_pinned(t: torch.Tensor) -> torch.Tensor:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            t.record_stream(copy_stream)
            return host

        with torch.cuda.stream(copy_stream):
            copy_stream.wait_event(ready)
            self._host = device_outputs.map(to_pinned)  # the same fields, in pinned host memory
            self._done = torch.cuda.Event()
            self._done.record(copy_stream)

    def wait(self) -> StepResult:
        """Block until the copies landed (the permitted per-step wait) and view them."""
        if self._done is not None:
            self._done.synchronize()
        host, lp, plp = self._host, self._host.logprobs, self._host.prompt_logprobs
        return StepResult(
            tokens=host.tokens.numpy(),
            accept_len=host.accept_len.numpy(),
            kv_len=host.kv_len.numpy(),
            logprob=None if lp is None else lp.logprob.numpy(),
            top_ids=None if lp is None else lp.top_ids.numpy(),
            top_logprobs=None if lp is None else lp.top_logprobs.numpy(),
            draft_len=None if host.draft_len is None else host.draft_len.numpy(),
            prompt_logprob=None if plp is None else plp.logprob.numpy(),
            prompt_top_ids=None if plp is None else plp.top_ids.numpy(),
            prompt_top_logprobs=None if plp is None else plp.top_logprobs.numpy(),
        )
