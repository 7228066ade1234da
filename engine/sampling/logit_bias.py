"""OpenAI `logit_bias` on the device (docs/design.md §2.4).

A batch carries its rows' (token id, bias) pairs as a padded table `[B, K]`: id -1 with
bias 0 pads, so a row without a bias, or with fewer than K entries, adds exactly 0. K is a
host-known bucket (`bias_width`: 0, then 8, 16, ..., 256, 300), so a step has a handful of
static shapes; a batch where no row has a bias carries no table and skips the op.

The runner keeps every row's pairs in a `LogitBiasTable` `[max_rows, K_table]` written at
admission, and a step gathers its rows' first K columns on the device, as it gathers the
other per-row sampling parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sampling.staging import PinnedPool, upload
from engine.sampling_params import MAX_LOGIT_BIAS_ENTRIES, SamplingParams

MIN_BIAS_WIDTH = 8


def bias_width(num_entries: int) -> int:
    """Columns that hold `num_entries` pairs: 0 for none, else the next power of two from
    MIN_BIAS_WIDTH, capped at MAX_LOGIT_BIAS_ENTRIES (300)."""
    if num_entries <= 0:
        return 0
    return min(MAX_LOGIT_BIAS_ENTRIES, max(MIN_BIAS_WIDTH, 1 << (num_entries - 1).bit_length()))


def batch_bias_width(params_list: Sequence[SamplingParams]) -> int:
    """The K a batch of these requests needs (0: no row has a bias)."""
    return bias_width(max((len(p.logit_bias or ()) for p in params_list), default=0))


def _host_rows(biases: Sequence[Mapping[int, float] | None], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU (token_ids [R, width] int64, values [R, width] float32), entries first, then -1 / 0."""
    token_ids = np.full((len(biases), width), -1, dtype=np.int64)
    values = np.zeros((len(biases), width), dtype=np.float32)
    for r, bias in enumerate(biases):
        if bias:
            token_ids[r, : len(bias)] = list(bias.keys())
            values[r, : len(bias)] = list(bias.values())
    return torch.from_numpy(token_ids), torch.from_numpy(values)


@dataclass(frozen=True)
class LogitBiasRows:
    """The logit-bias pairs of a batch, one row per batch row."""

    token_ids: torch.Tensor  # [B, K] int64; -1 = no entry
    values: torch.Tensor  # [B, K] float32; 0 on padding

    @classmethod
    def from_params(
        cls,
        params_list: Sequence[SamplingParams],
        device: torch.device,
        pinned_pool: PinnedPool | None = None,
    ) -> LogitBiasRows | None:
        """The batch's pairs as device tensors (two non-blocking copies); None when no row
        has a bias."""
        width = batch_bias_width(params_list)
        if width == 0:
            return None
        token_ids, values = _host_rows([p.logit_bias for p in params_list], width)
        return cls(upload(token_ids, device, pinned_pool), upload(values, device, pinned_pool))

    def index_select(self, rows: torch.Tensor) -> LogitBiasRows:
        """Rows `rows` [B'] (int64, device) as a batch."""
        return LogitBiasRows(self.token_ids.index_select(0, rows), self.values.index_select(0, rows))

    def repeat_rows(self, times: int) -> LogitBiasRows:
        """Each row `times` times in a row ([B*times, K]), e.g. for the W rows of a verify window."""
        size = self.token_ids.shape[0] * times
        return LogitBiasRows(
            self.token_ids.repeat_interleave(times, dim=0, output_size=size),
            self.values.repeat_interleave(times, dim=0, output_size=size),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] float32 logits + each row's biases, as a new tensor (the raw logits stay
        intact for logprobs). Padding adds 0 at token 0; ids are unique within a row, so
        the sum does not depend on the order of the scatter's atomic adds."""
        return logits.scatter_add(1, self.token_ids.clamp(min=0), self.values)


class LogitBiasTable:
    """Every row's pairs on the device, `[max_rows, K_table]`, K_table the widest bucket
    admitted so far. Allocated on the first biased request, so a server whose requests never
    use `logit_bias` pays nothing; grown (a device copy) when a wider one arrives. The host
    remembers how many entries each row holds, to clear a row only when a previous request
    left some there."""

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device | str) -> None:
        self.max_rows = max_rows
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.token_ids: torch.Tensor | None = None  # [max_rows, K_table] int64; -1 = no entry
        self.values: torch.Tensor | None = None  # [max_rows, K_table] float32; 0 on padding
        self._row_entries = np.zeros(max_rows, dtype=np.int64)  # host: entries held per row

    @property
    def width(self) -> int:
        return 0 if self.token_ids is None else int(self.token_ids.shape[1])

    def _grow(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.token_ids is None or self.values is None or self.width < width:
            token_ids = torch.full((self.max_rows, width), -1, dtype=torch.int64, device=self.device)
            values = torch.zeros((self.max_rows, width), dtype=torch.float32, device=self.device)
            if self.token_ids is not None and self.values is not None:
                token_ids[:, : self.width] = self.token_ids
                values[:, : self.width] = self.values
            self.token_ids, self.values = token_ids, values
        return self.token_ids, self.values

    def set_row(
        self, row: int, bias: Mapping[int, float] | None, row_d: torch.Tensor, pinned_pool: PinnedPool | None = None
    ) -> None:
        """Host side, at admission: row `row` (also as `row_d` [1] int64 on the device) now
        holds `bias`. Non-blocking copies only. Ids outside the vocabulary are dropped: the
        engine's boundary rejects them (SamplingParams.check_vocab), and the scatter must
        never index past the logits."""
        if not 0 <= row < self.max_rows:
            raise ValueError(f"row {row} out of range [0, {self.max_rows})")
        kept = {t: b for t, b in (bias or {}).items() if t < self.vocab_size}
        if not kept and self._row_entries[row] == 0:
            return
        token_ids, values = self._grow(bias_width(len(kept)))
        host_ids, host_values = _host_rows([kept], self.width)
        token_ids.index_copy_(0, row_d, upload(host_ids, self.device, pinned_pool))
        values.index_copy_(0, row_d, upload(host_values, self.device, pinned_pool))
        self._row_entries[row] = len(kept)

    def gather(self, rows_d: torch.Tensor, width: int) -> LogitBiasRows | None:
        """The first `width` columns of rows `rows_d` [B] (device); `width` is the batch's
        `batch_bias_width`, None when 0 (no row of the batch has a bias)."""
        if width == 0 or self.token_ids is None or self.values is None:
            return None
        width = min(width, self.width)  # == batch_bias_width when every row was admitted here
        return LogitBiasRows(self.token_ids[:, :width], self.values[:, :width]).index_select(rows_d)
