"""SlotAllocator: whole-page allocation, exact accounting, and loud misuse."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kv.allocator import SlotAllocator


def _pages(slots: np.ndarray, page_size: int) -> np.ndarray:
    return slots[::page_size] // page_size


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_alloc_rounds_up_to_whole_page_runs(page_size: int) -> None:
    alloc = SlotAllocator(num_pages=8, page_size=page_size)
    slots = alloc.alloc(page_size + 1)
    assert slots is not None and slots.dtype == np.int64
    assert slots.size == 2 * page_size
    pages = _pages(slots, page_size)
    np.testing.assert_array_equal(slots, (pages[:, None] * page_size + np.arange(page_size)).ravel())
    assert alloc.num_free_slots == 6 * page_size
    assert alloc.alloc(0) is not None and alloc.alloc(0).size == 0  # type: ignore[union-attr]
    assert alloc.num_free_slots == 6 * page_size


def test_fresh_allocator_hands_out_pages_in_order() -> None:
    alloc = SlotAllocator(num_pages=4, page_size=2)
    np.testing.assert_array_equal(alloc.alloc(3), [0, 1, 2, 3])
    np.testing.assert_array_equal(alloc.alloc(1), [4, 5])


def test_none_when_full_and_never_partial() -> None:
    alloc = SlotAllocator(num_pages=4, page_size=4)
    first = alloc.alloc(9)  # 3 pages
    assert first is not None
    assert alloc.alloc(5) is None  # needs 2 pages, 1 free
    assert alloc.num_free_slots == 4
    last = alloc.alloc(4)
    assert last is not None
    assert alloc.alloc(1) is None
    assert alloc.num_free_slots == 0 and alloc.usage_ratio == 1.0
    alloc.free(first)
    assert alloc.num_free_slots == 12
    assert alloc.usage_ratio == pytest.approx(0.25)


def test_double_free_and_bad_runs_raise_without_changing_state() -> None:
    alloc = SlotAllocator(num_pages=4, page_size=4)
    a = alloc.alloc(8)
    b = alloc.alloc(4)
    assert a is not None and b is not None
    alloc.free(a[:4])
    with pytest.raises(ValueError, match="double free"):
        alloc.free(a)  # first page already free: nothing of `a` may be freed
    assert alloc.num_free_slots == 8
    with pytest.raises(ValueError, match="more than once"):
        alloc.free(np.concatenate([b, b]))
    with pytest.raises(ValueError, match="whole pages"):
        alloc.free(b[:3])
    with pytest.raises(ValueError, match="page runs"):
        alloc.free(b[::-1].copy())
    with pytest.raises(ValueError, match="out of range"):
        alloc.free(np.arange(16, 20))
    with pytest.raises(ValueError, match="negative"):
        alloc.alloc(-1)
    assert alloc.num_free_slots == 8
    alloc.free(np.concatenate([b, a[4:]]))  # any concatenation of page runs
    assert alloc.num_free_slots == 16
    with pytest.raises(ValueError):
        SlotAllocator(0, 4)
    with pytest.raises(ValueError):
        SlotAllocator(4, 0)


def test_sink_slot_is_one_past_the_pool() -> None:
    alloc = SlotAllocator(num_pages=3, page_size=16)
    assert alloc.num_total_slots == 48 and alloc.sink_slot == 48


@pytest.mark.parametrize("page_size", [1, 3])
def test_random_alloc_free_never_double_allocates(page_size: int) -> None:
    rng = np.random.default_rng(0)
    num_pages = 64
    alloc = SlotAllocator(num_pages, page_size)
    held: list[np.ndarray] = []
    owner = np.zeros(num_pages * page_size, dtype=bool)
    for _ in range(3000):
        if held and rng.random() < 0.45:
            freed = held.pop(int(rng.integers(len(held))))
            assert owner[freed].all()
            owner[freed] = False
            alloc.free(freed)
        else:
            want = int(rng.integers(0, 4 * page_size + 1))
            slots = alloc.alloc(want)
            expected_pages = -(-want // page_size)
            if expected_pages > num_pages - int(owner.sum()) // page_size:
                assert slots is None
                continue
            assert slots is not None and slots.size == expected_pages * page_size
            assert not owner[slots].any(), "slot handed out twice"
            owner[slots] = True
            held.append(slots)
        assert alloc.num_free_slots + int(owner.sum()) == alloc.num_total_slots
        np.testing.assert_array_equal(alloc.is_allocated(np.arange(owner.size)), owner)


def test_large_pool_accounting() -> None:
    alloc = SlotAllocator(num_pages=100_000, page_size=16)
    held = [alloc.alloc(16 * 8) for _ in range(10_000)]
    for slots in held:
        assert slots is not None
        alloc.free(slots)
    assert alloc.num_free_slots == alloc.num_total_slots
