"""The host's search for keys a forward's requests read through the same slots
(engine/runner/shared_prefix_rows.py, docs/design.md §4.9): what it returns must hold for the
kernels to be exact, and it must pick the length that saves the most reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.runner.shared_prefix_rows import (
    ALIGN,
    MIN_SHARED_TOKENS,
    SharedRows,
    find_shared_prefix,
    stage,
    unpack,
)

PAGE = 16


class Pages:
    """Page runs as engine/kv/allocator.py hands them out: page p holds slots p*PAGE + [0, PAGE)."""

    def __init__(self) -> None:
        self.next_page = 0

    def run(self, num_pages: int) -> np.ndarray:
        pages = np.arange(self.next_page, self.next_page + num_pages)
        self.next_page += num_pages
        return (pages[:, None] * PAGE + np.arange(PAGE)).reshape(-1)


def table_of(prefixes: list[np.ndarray], own_pages: list[int], max_context: int = 1024) -> np.ndarray:
    """One table row per request: its shared runs, then pages of its own; -1 past them."""
    pages = Pages()
    table = np.full((len(prefixes) + 1, max_context), -1, dtype=np.int32)
    for row, (prefix, own) in enumerate(zip(prefixes, own_pages, strict=True)):
        slots = np.concatenate((prefix, pages.run(own) + 100_000))
        table[row, : len(slots)] = slots
    return table


def assert_exact(table: np.ndarray, rows: np.ndarray, visible: np.ndarray, shared: SharedRows) -> None:
    """The invariant of AttentionMetadata.shared, which the kernels rely on."""
    p = shared.length
    assert p % ALIGN == 0 and p >= MIN_SHARED_TOKENS
    assert set(np.unique(shared.lens)) <= {0, p}
    for b, row in enumerate(rows):
        if shared.lens[b]:
            assert p <= visible[b]
            np.testing.assert_array_equal(table[row, :p], table[shared.table_row, :p])


def test_a_system_prompt_shared_by_every_row():
    system = Pages().run(40)  # 640 keys
    table = table_of([system] * 5, [3, 7, 1, 4, 2])
    rows = np.arange(5)
    visible = np.array([680, 700, 650, 690, 660])
    shared = find_shared_prefix(table, rows, visible, PAGE)
    assert shared is not None
    assert shared.length == 640 // ALIGN * ALIGN
    assert shared.lens.tolist() == [shared.length] * 5
    assert_exact(table, rows, visible, shared)


def test_rows_share_only_what_they_see_and_odd_rows_are_left_out():
    pages = Pages()
    system = pages.run(40)
    other = pages.run(40) + 50_000  # another system prompt
    table = table_of([system, system, other, system, system], [2, 2, 2, 2, 2])
    rows = np.arange(5)
    visible = np.array([700, 300, 700, 700, 700])  # row 1 has seen only 300 keys so far
    shared = find_shared_prefix(table, rows, visible, PAGE)
    assert shared is not None
    assert shared.lens[2] == 0  # the other prompt
    assert shared.length == 640 and shared.lens.tolist() == [640, 0, 0, 640, 640]  # 3 x 640 > 4 x 256
    assert_exact(table, rows, visible, shared)


def test_nothing_when_too_little_is_shared():
    pages = Pages()
    short = pages.run(8)  # 128 keys
    table = table_of([short, short, short], [20, 20, 20])
    assert find_shared_prefix(table, np.arange(3), np.array([400, 400, 400]), PAGE) is None
    table = table_of([Pages().run(40)], [2])
    assert find_shared_prefix(table, np.arange(1), np.array([600]), PAGE) is None  # one row shares with nobody


@pytest.mark.parametrize("seed", range(20))
def test_random_tables_give_the_most_reads_saved(seed: int):
    """Against brute force over every aligned length: the invariant holds and no length
    covers more key reads (rows sharing it x its length) from the chosen reference."""
    rng = np.random.default_rng(seed)
    pages = Pages()
    trunk = pages.run(64)
    branches = [trunk[: PAGE * int(rng.integers(0, 64))] for _ in range(int(rng.integers(2, 9)))]
    rows_prefix = [branches[int(rng.integers(len(branches)))] for _ in range(int(rng.integers(2, 12)))]
    table = table_of(rows_prefix, [int(rng.integers(1, 6)) for _ in rows_prefix], max_context=2048)
    rows = rng.permutation(len(rows_prefix))
    written = (table[rows] >= 0).sum(axis=1)
    visible = np.array([int(rng.integers(w // 2, w + 1)) for w in written])
    shared = find_shared_prefix(table, rows, visible, PAGE)
    if shared is None:
        return
    assert_exact(table, rows, visible, shared)
    ref = table[shared.table_row]
    best = 0
    for length in range(MIN_SHARED_TOKENS, 2048 + 1, ALIGN):
        count = sum(
            1
            for b, row in enumerate(rows)
            if length <= visible[b] and np.array_equal(table[row, :length], ref[:length])
        )
        if count >= 2:
            best = max(best, count * length)
    assert int(np.count_nonzero(shared.lens)) * shared.length == best


def test_packed_buffer_round_trip_and_staging():
    shared = SharedRows(np.array([512, 0, 512], dtype=np.int32), 512, 7)
    device = unpack(torch.from_numpy(shared.packed()), max_length=4096)
    assert device.length.tolist() == [512] and device.table_row.tolist() == [7]
    assert device.lens.tolist() == [512, 0, 512] and device.max_length == 4096
    assert device.rows(1, 3).lens.tolist() == [0, 512]
    buffer = torch.full((2 + 8,), 99, dtype=torch.int32)
    stage(buffer, shared, bucket=4)
    assert buffer.tolist() == [512, 7, 512, 0, 512, 0, 99, 99, 99, 99]  # padding rows share nothing
