"""Which keys the requests of a forward read through the same slots, found on the host from its
mirror of `req_to_token` (docs/design.md §4.9).

Slots come in page runs (engine/kv/allocator.py): position i of a request lies at offset
i % page_size of some page. So two requests share the page of positions [k * page_size,
(k + 1) * page_size) exactly when their entries at k * page_size are equal, and comparing one
entry per page finds the common prefix of two rows. Nothing here reads the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.kernels.attention_metadata import SharedPrefix
from engine.runner.h2d import copy_into, to_device

ALIGN = 128  # the shared length is a multiple of every kernel's key tile
MIN_SHARED_TOKENS = 256  # below this, the shared pass costs about what it saves
MIN_SHARING_ROWS = 2


@dataclass(frozen=True)
class SharedRows:
    """The host's answer for one forward of B requests."""

    lens: np.ndarray  # [B] int32: `length` for a request that shares the keys, else 0
    length: int  # P: keys [0, P) are shared
    table_row: int  # a req_to_token row whose first P entries are those slots

    def packed(self) -> np.ndarray:
        """[2 + B] int32: P, the table row, then `lens` (one host-to-device copy)."""
        return np.concatenate(([self.length, self.table_row], self.lens)).astype(np.int32)

    def to_device(self, device: torch.device, max_length: int) -> SharedPrefix:
        return unpack(to_device(self.packed(), device), max_length)


def unpack(packed: torch.Tensor, max_length: int) -> SharedPrefix:
    """The SharedPrefix views of a packed [2 + B] int32 device buffer."""
    return SharedPrefix(lens=packed[2:], length=packed[0:1], table_row=packed[1:2], max_length=max_length)


def stage(buffer: torch.Tensor, shared: SharedRows, bucket: int) -> None:
    """Copy `shared` into a captured step's packed buffer for `bucket` rows (rows past its
    batch share nothing)."""
    packed = np.zeros(2 + bucket, dtype=np.int32)
    host = shared.packed()
    packed[: len(host)] = host
    copy_into(buffer[: 2 + bucket], packed)


def find_shared_prefix(
    table: np.ndarray,  # [rows, max_context] int32, the host mirror of req_to_token
    rows: np.ndarray,  # [B] the forward's table rows
    visible: np.ndarray,  # [B] keys each request sees before its own rows (a lower bound)
    page_size: int,
) -> SharedRows | None:
    """The shared length P (a multiple of ALIGN) that covers the most key reads, P x rows
    sharing it, and which rows share it; None when fewer than MIN_SHARING_ROWS rows share
    MIN_SHARED_TOKENS keys. Each row shares at most the keys it sees whole."""
    batch = len(rows)
    if batch < MIN_SHARING_ROWS:
        return None
    visible = np.asarray(visible, dtype=np.int64)
    limit = int(visible.max()) // ALIGN * ALIGN
    if limit < MIN_SHARED_TOKENS:
        return None
    page_starts = table[np.asarray(rows)[:, None], np.arange(0, limit, page_size)[None, :]]  # [B, pages]
    best: SharedRows | None = None
    for ref in {int(np.argmax(visible)), 0}:  # a reference row; two guard against an odd one out
        same = page_starts == page_starts[ref]
        pages = np.where(same.all(axis=1), same.shape[1], np.argmin(same, axis=1))
        reach = np.minimum(pages * page_size, visible) // ALIGN * ALIGN  # [B] keys each row shares
        candidate = _best_length(reach, int(rows[ref]))
        if candidate is not None and (best is None or _reads(candidate) > _reads(best)):
            best = candidate
    return best


def _best_length(reach: np.ndarray, table_row: int) -> SharedRows | None:
    lengths = np.unique(reach[reach >= MIN_SHARED_TOKENS])
    if len(lengths) == 0:
        return None
    sharing = (reach[None, :] >= lengths[:, None]).sum(axis=1)  # rows covering each length
    reads = np.where(sharing >= MIN_SHARING_ROWS, lengths * sharing, 0)
    pick = int(np.argmax(reads))
    if reads[pick] == 0:
        return None
    length = int(lengths[pick])
    lens = np.where(reach >= length, length, 0).astype(np.int32)
    return SharedRows(lens, length, table_row)


def _reads(shared: SharedRows) -> int:
    return int(np.count_nonzero(shared.lens)) * shared.length
