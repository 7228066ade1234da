"""Page-granular allocator of KV slot ids (host only).

The KV pool is `num_pages * page_size` token slots; slot id `page * page_size + offset`
is row `slot` of every layer's device pool. The device pools carry one extra row, index
`num_total_slots` (`SlotAllocator.sink_slot`), that absorbs writes to slot -1; it is never
allocated here.

Slots are handed out and taken back a whole page at a time, always as *page runs*: for each
page, its `page_size` slots in offset order. A request's slot table is a concatenation of
such runs, so position `i` of a request always lands at offset `i % page_size` of some page,
which is what lets the prefix cache share whole pages between requests.
"""

from __future__ import annotations

import numpy as np


class SlotAllocator:
    """A LIFO free list of pages over a numpy stack: `alloc` and `free` cost O(pages moved)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._offsets = np.arange(page_size, dtype=np.int64)
        # Free pages are _free_pages[:_num_free]; the top of the stack is popped first.
        # Stored in descending order so that a fresh allocator hands out pages 0, 1, 2, ...
        self._free_pages = np.arange(num_pages - 1, -1, -1, dtype=np.int64)
        self._num_free = num_pages
        self._page_used = np.zeros(num_pages, dtype=bool)

    @property
    def num_total_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_slots(self) -> int:
        return self._num_free * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._num_free

    @property
    def usage_ratio(self) -> float:
        """Fraction of slots handed out (to requests or to the prefix cache), 0..1."""
        return 1.0 - self._num_free / self.num_pages

    @property
    def sink_slot(self) -> int:
        """Index of the device pools' extra row that slot -1 writes land in."""
        return self.num_total_slots

    def alloc(self, num_slots: int) -> np.ndarray | None:
        """Slots of `ceil(num_slots / page_size)` whole pages, as page runs in page order:
        `[len] int64` with `len = pages * page_size >= num_slots`. The caller owns every
        returned slot (including the rounding past `num_slots`) until it frees them or hands
        them to the prefix cache. Returns None, and allocates nothing, when there are not
        enough free pages; it never evicts (the caller asks the prefix cache to)."""
        if num_slots < 0:
            raise ValueError(f"cannot allocate a negative number of slots ({num_slots})")
        num_pages = -(-num_slots // self.page_size)
        if num_pages > self._num_free:
            return None
        top = self._num_free
        pages = self._free_pages[top - num_pages : top][::-1].copy()
        self._num_free = top - num_pages
        self._page_used[pages] = True
        return self._page_runs(pages)

    def free(self, slots: np.ndarray) -> None:
        """Give back the pages of `slots`, which must be whole page runs (as `alloc` returns
        them, or any concatenation of such runs) of pages currently allocated. Raises
        ValueError on a partial page, a page given twice, or a page that is already free
        (double free); in that case nothing is freed."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        pages = self._pages_of_runs(slots)
        used = self._page_used[pages]
        if not used.all():
            raise ValueError(f"double free of KV pages {pages[~used][:8].tolist()} (already free)")
        if np.unique(pages).size != pages.size:
            raise ValueError("free() was given the same KV page more than once")
        self._page_used[pages] = False
        top = self._num_free
        self._free_pages[top : top + pages.size] = pages[::-1]
        self._num_free = top + pages.size

    def pages_of(self, slots: np.ndarray) -> np.ndarray:
        """`[len // page_size] int64`: the page of each page run in `slots` (validated)."""
        return self._pages_of_runs(np.asarray(slots, dtype=np.int64))

    def is_allocated(self, slots: np.ndarray) -> np.ndarray:
        """`[len] bool`: whether the page holding each slot is currently handed out."""
        slots = np.asarray(slots, dtype=np.int64)
        return self._page_used[slots // self.page_size]

    def _page_runs(self, pages: np.ndarray) -> np.ndarray:
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def _pages_of_runs(self, slots: np.ndarray) -> np.ndarray:
        if slots.ndim != 1 or slots.size % self.page_size:
            raise ValueError(f"expected whole pages of {self.page_size} slots, got shape {tuple(slots.shape)}")
        runs = slots.reshape(-1, self.page_size)
        pages = runs[:, 0] // self.page_size
        if not ((runs[:, 0] >= 0).all() and (pages < self.num_pages).all()):
            raise ValueError(f"slot ids out of range [0, {self.num_total_slots})")
        if not np.array_equal(runs, pages[:, None] * self.page_size + self._offsets):
            raise ValueError("slots are not whole page runs (page * page_size + 0 .. page_size-1)")
        return pages
