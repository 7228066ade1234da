"""RadixCache: page-granular matching, the ownership rule of `insert`, locking, LRU eviction,
and a randomized model check of thousands of scheduler-like operations against a reference
that is a plain dict {page-aligned token prefix: page id}."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from engine.kv.allocator import SlotAllocator
from engine.kv.radix import NullPrefixCache, PrefixCache, RadixCache, RadixNode
from engine.kv.token_prefix import common_prefix_len

Prefix = tuple[int, ...]


def _runs(pages: list[int] | np.ndarray, page_size: int) -> np.ndarray:
    pages = np.asarray(pages, dtype=np.int64)
    return (pages[:, None] * page_size + np.arange(page_size)).reshape(-1)


def _tree_items(cache: RadixCache) -> dict[Prefix, int]:
    """The tree's content as {page-aligned prefix: page of its last page} (reads internals)."""
    ps = cache.page_size
    items: dict[Prefix, int] = {}
    stack: list[tuple[RadixNode, Prefix]] = [(cache._root, ())]
    while stack:
        node, prefix = stack.pop()
        key, runs = node.key.tolist(), node.value.reshape(-1, ps)
        assert (runs[:, 0] % ps == 0).all() and (runs == runs[:, :1] + np.arange(ps)).all()
        for j, page in enumerate((runs[:, 0] // ps).tolist()):
            prefix = prefix + tuple(key[j * ps : (j + 1) * ps])
            items[prefix] = page
        for first_page, child in node.children.items():
            assert tuple(child.key[:ps].tolist()) == first_page and child.parent is node
            assert child.lock_ref <= node.lock_ref or node.parent is None
            stack.append((child, prefix))
    return items


def _ref_match(ref: dict[Prefix, int], tokens: list[int], page_size: int) -> list[int]:
    pages: list[int] = []
    while (len(pages) + 1) * page_size <= len(tokens):
        page = ref.get(tuple(tokens[: (len(pages) + 1) * page_size]))
        if page is None:
            break
        pages.append(page)
    return pages


def _alloc(allocator: SlotAllocator, n: int) -> np.ndarray:
    slots = allocator.alloc(n)
    assert slots is not None
    return slots


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize("page_size", [1, 4])
def test_match_insert_shared_prefixes(page_size: int) -> None:
    allocator = SlotAllocator(64, page_size)
    cache = RadixCache(page_size, allocator)
    a = list(range(100, 100 + 3 * page_size))  # three pages
    b = a[: 2 * page_size] + [7] * (2 * page_size)  # shares two pages with a
    assert cache.match_prefix(a).num_tokens == 0

    slots_a = _alloc(allocator, len(a))
    assert cache.insert(a, slots_a) == len(a)
    m = cache.match_prefix(a + [1, 2])
    np.testing.assert_array_equal(m.slots, slots_a)

    mb = cache.match_prefix(b)  # splits a's edge after two pages
    assert mb.num_tokens == 2 * page_size
    np.testing.assert_array_equal(mb.slots, slots_a[: 2 * page_size])
    slots_b = np.concatenate([mb.slots, _alloc(allocator, 2 * page_size)])
    assert cache.insert(b, slots_b) == len(b)
    np.testing.assert_array_equal(cache.match_prefix(b).slots, slots_b)
    np.testing.assert_array_equal(cache.match_prefix(a).slots, slots_a)
    assert cache.cached_slots == 5 * page_size == allocator.num_total_slots - allocator.num_free_slots
    assert len(_tree_items(cache)) == 5


def test_partial_pages_are_never_cached() -> None:
    allocator = SlotAllocator(16, 4)
    cache = RadixCache(4, allocator)
    tokens = list(range(10))  # two whole pages + 2 tokens
    slots = _alloc(allocator, 10)  # 3 pages
    owned = cache.insert(tokens, slots)
    assert owned == 8
    allocator.free(slots[owned:])  # the caller frees the partial page
    assert cache.cached_slots == 8 and allocator.num_free_slots == 64 - 8
    assert cache.match_prefix(tokens[:7]).num_tokens == 4
    assert cache.match_prefix(tokens[:3]).num_tokens == 0
    assert cache.insert(tokens[:3], slots[:3]) == 0
    # A mismatch inside a page ends the match at the page before it.
    assert cache.match_prefix([0, 1, 2, 3, 4, 99, 6, 7]).num_tokens == 4


@pytest.mark.parametrize("page_size", [1, 4])
def test_insert_frees_the_callers_duplicates(page_size: int) -> None:
    allocator = SlotAllocator(32, page_size)
    cache = RadixCache(page_size, allocator)
    tokens = list(range(2 * page_size))
    first = _alloc(allocator, len(tokens))
    cache.insert(tokens, first)
    # Another request computed the same tokens into its own pages, plus one more page.
    longer = tokens + [9] * page_size
    second = _alloc(allocator, len(longer))
    free_before = allocator.num_free_slots
    assert cache.insert(longer, second) == len(longer)
    assert allocator.num_free_slots == free_before + 2 * page_size  # its duplicates went back
    assert not allocator.is_allocated(second[: 2 * page_size]).any()
    expected = np.concatenate([first, second[2 * page_size :]])
    np.testing.assert_array_equal(cache.match_prefix(longer).slots, expected)
    # A request that borrowed the prefix inserts its own pages after it: nothing is freed.
    m = cache.match_prefix(longer)
    cache.lock(m.node)
    mine = _alloc(allocator, page_size)
    free_before = allocator.num_free_slots
    assert cache.insert(longer + [5] * page_size, np.concatenate([m.slots, mine])) == len(longer) + page_size
    assert allocator.num_free_slots == free_before
    cache.unlock(m.node)
    assert cache.cached_slots + allocator.num_free_slots == allocator.num_total_slots


def test_insert_rejects_misuse_without_changing_ownership() -> None:
    allocator = SlotAllocator(16, 2)
    cache = RadixCache(2, allocator)
    slots = _alloc(allocator, 4)
    cache.insert([1, 2, 3, 4], slots)
    other = _alloc(allocator, 4)
    with pytest.raises(ValueError, match="page runs"):
        cache.insert([5, 6, 7, 8], other[::-1].copy())
    with pytest.raises(ValueError, match="already owns"):
        cache.insert([5, 6, 7, 8], slots)  # the tree's pages under other tokens
    with pytest.raises(ValueError, match="twice"):
        cache.insert([5, 6, 7, 8], np.concatenate([other[:2], other[:2]]))
    allocator.free(other)
    with pytest.raises(ValueError, match="free pages"):
        cache.insert([5, 6, 7, 8], other)
    with pytest.raises(ValueError, match="a slot for each"):
        cache.insert([5, 6, 7, 8], other[:2])
    assert cache.cached_slots == 4 and allocator.num_free_slots == 32 - 4
    with pytest.raises(ValueError):
        RadixCache(4, allocator)


# --------------------------------------------------------------------------- locking and LRU


def test_locked_prefixes_are_never_evicted() -> None:
    allocator = SlotAllocator(32, 1)
    cache = RadixCache(1, allocator)
    for seq in ([1, 2, 3], [1, 2, 4, 5], [6, 7]):
        cache.insert(seq, _alloc(allocator, len(seq)))
    m = cache.match_prefix([1, 2, 4, 5])
    cache.lock(m.node)
    cache.lock(m.node)  # locks nest
    assert cache.protected_slots == 4 and cache.evictable_slots == 3
    assert cache.evict(100) == 3
    np.testing.assert_array_equal(cache.match_prefix([1, 2, 4, 5]).slots, m.slots)
    cache.unlock(m.node)
    assert cache.evict(100) == 0
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.unlock(m.node)
    with pytest.raises(RuntimeError, match="not locked"):
        cache.unlock(m.node)
    assert cache.evictable_slots == 4
    assert cache.evict(3) == 4  # whole nodes: [1, 2] becomes a leaf once [4, 5] is gone
    assert cache.cached_slots == 0 and allocator.num_free_slots == 32


def test_evict_is_least_recently_used_first() -> None:
    allocator = SlotAllocator(32, 1)
    cache = RadixCache(1, allocator)
    seqs = {"a": [1, 2, 3], "b": [4, 5], "c": [6], "d": [1, 2, 7]}
    for seq in seqs.values():  # inserted a, b, c, d: d splits a into [1, 2] + [3], [7]
        cache.insert(seq, _alloc(allocator, len(seq)))
    cache.match_prefix(seqs["a"])  # now b is the oldest, then c, then d's [7]
    assert cache.evict(1) == 2 and cache.match_prefix(seqs["b"]).num_tokens == 0
    assert cache.evict(1) == 1 and cache.match_prefix(seqs["c"]).num_tokens == 0
    assert cache.evict(1) == 1 and cache.match_prefix(seqs["d"]).num_tokens == 2
    assert cache.match_prefix(seqs["a"]).num_tokens == 3
    assert cache.evict(2) == 3  # [3], then its parent [1, 2]
    assert cache.cached_slots == 0


def test_stale_handle_and_reset() -> None:
    allocator = SlotAllocator(8, 2)
    cache = RadixCache(2, allocator)
    cache.insert([1, 2, 3, 4], _alloc(allocator, 4))
    m = cache.match_prefix([1, 2, 3, 4])
    assert cache.evict(1) == 4  # not locked: fair game
    with pytest.raises(RuntimeError, match="evicted"):
        cache.lock(m.node)
    cache.insert([1, 2], _alloc(allocator, 2))
    cache.reset()
    assert cache.cached_slots == 0 and allocator.num_free_slots == 16
    assert cache.match_prefix([1, 2]).num_tokens == 0


def test_null_prefix_cache() -> None:
    allocator = SlotAllocator(8, 2)
    cache: PrefixCache = NullPrefixCache()
    slots = _alloc(allocator, 6)
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.num_tokens == 0 and m.slots.dtype == np.int64
    cache.lock(m.node)
    owned = cache.insert([1, 2, 3, 4, 5, 6], slots)
    assert owned == 0
    allocator.free(slots[owned:])
    cache.unlock(m.node)
    assert cache.evict(10) == 0 and cache.cached_slots == 0 and cache.evictable_slots == 0
    assert allocator.num_free_slots == 16
    cache.reset()


def test_large_tree_accounting() -> None:
    page_size, num_pages = 16, 100_000
    allocator = SlotAllocator(num_pages, page_size)
    cache = RadixCache(page_size, allocator)
    rng = np.random.default_rng(0)
    system = rng.integers(0, 50_000, 1024).tolist()
    for _ in range(2000):  # multi-turn: a shared system prompt, then a private history
        tokens = system + rng.integers(0, 50_000, 512).tolist()
        m = cache.match_prefix(tokens)
        cache.lock(m.node)
        rest = allocator.alloc(len(tokens) - m.num_tokens)
        if rest is None:
            cache.evict(len(tokens))
            rest = _alloc(allocator, len(tokens) - m.num_tokens)
        cache.insert(tokens, np.concatenate([m.slots, rest]))
        cache.unlock(m.node)
    cached = cache.cached_slots
    assert cached > 0 and cache.evict(num_pages * page_size) == cached
    assert cache.cached_slots == 0 and allocator.num_free_slots == num_pages * page_size


# --------------------------------------------------------------------------- model check


@dataclass(eq=False)
class _Req:
    tokens: list[int]
    table: np.ndarray  # slots of positions [0, len(table)); [0, num_cached) borrowed from the tree
    num_cached: int
    node: RadixNode


class _Model:
    """Drives a RadixCache like the scheduler does and checks it after every step."""

    def __init__(self, page_size: int, num_pages: int, seed: int) -> None:
        self.ps = page_size
        self.rng = np.random.default_rng(seed)
        self.allocator = SlotAllocator(num_pages, page_size)
        self.cache = RadixCache(page_size, self.allocator)
        self.ref: dict[Prefix, int] = {}
        self.reqs: list[_Req] = []
        self.histories: list[list[int]] = [[]]
        self.evictions = self.duplicates_freed = self.failed_allocs = 0

    def random_tokens(self) -> list[int]:
        base = self.histories[int(self.rng.integers(len(self.histories)))]
        if self.rng.random() < 0.5:
            base = base[: int(self.rng.integers(len(base) + 1))]
        return base + self.rng.integers(0, 3, int(self.rng.integers(0, 3 * self.ps + 2))).tolist()

    def check_match(self, tokens: list[int]) -> None:
        m = self.cache.match_prefix(tokens)
        assert m.slots.tolist() == _runs(_ref_match(self.ref, tokens, self.ps), self.ps).tolist()

    def evict(self, num_slots: int) -> int:
        before, evictable = dict(self.ref), self.cache.evictable_slots
        freed = self.cache.evict(num_slots)
        after = _tree_items(self.cache)
        assert after.items() <= before.items(), "eviction changed or added entries"
        gone = [page for prefix, page in before.items() if prefix not in after]
        assert freed == len(gone) * self.ps
        assert freed >= min(max(num_slots, 0), evictable)
        assert not self.allocator.is_allocated(_runs(gone, self.ps)).any()
        for req in self.reqs:  # borrowed prefixes survive
            borrowed = _ref_match(after, req.tokens[: req.num_cached], self.ps)
            assert _runs(borrowed, self.ps).tolist() == req.table[: req.num_cached].tolist()
        self.ref = after
        self.evictions += freed > 0
        return freed

    def start(self) -> None:
        tokens = self.random_tokens()
        self.check_match(tokens)
        m = self.cache.match_prefix(tokens)
        self.cache.lock(m.node)
        need = len(tokens) - m.num_tokens + int(self.rng.integers(0, 2 * self.ps))
        slots = self.allocator.alloc(need)
        if slots is None:
            self.evict(need - self.allocator.num_free_slots)
            slots = self.allocator.alloc(need)
        if slots is None:
            self.failed_allocs += 1
            self.cache.unlock(m.node)
            return
        assert slots.size == -(-need // self.ps) * self.ps
        self.reqs.append(_Req(tokens, np.concatenate([m.slots, slots]), m.num_tokens, m.node))

    def offer(self, req: _Req, kv_len: int) -> int:
        """insert() the first kv_len tokens, checking the ownership rule against the reference."""
        n = kv_len - kv_len % self.ps
        expect_freed: list[int] = []
        for j in range(n // self.ps):
            prefix, mine = tuple(req.tokens[: (j + 1) * self.ps]), int(req.table[j * self.ps] // self.ps)
            theirs = self.ref.setdefault(prefix, mine)
            if theirs != mine:
                expect_freed.append(mine)
        free_before = self.allocator.num_free_slots
        owned = self.cache.insert(req.tokens[:kv_len], req.table[:kv_len])
        assert owned == n
        assert self.allocator.num_free_slots == free_before + len(expect_freed) * self.ps
        assert not self.allocator.is_allocated(_runs(expect_freed, self.ps)).any()
        self.duplicates_freed += len(expect_freed)
        assert _tree_items(self.cache) == self.ref
        return owned

    def finish(self, req: _Req) -> None:
        kv_len = int(self.rng.integers(req.num_cached, len(req.tokens) + 1))
        owned = self.offer(req, kv_len)
        self.allocator.free(req.table[max(owned, req.num_cached) :])
        self.cache.unlock(req.node)
        self.reqs.remove(req)
        self.histories.append(req.tokens[:kv_len])

    def abort(self, req: _Req) -> None:
        self.allocator.free(req.table[req.num_cached :])
        self.cache.unlock(req.node)
        self.reqs.remove(req)

    def keep_running(self, req: _Req) -> None:
        """Insert a running request's tokens, then re-borrow them as the docstring says."""
        owned = self.offer(req, len(req.tokens))
        m = self.cache.match_prefix(req.tokens)
        assert m.num_tokens == owned
        self.cache.lock(m.node)
        self.cache.unlock(req.node)
        req.table = np.concatenate([m.slots, req.table[owned:]])
        req.num_cached, req.node = owned, m.node

    def check_invariants(self) -> None:
        ps, total = self.ps, self.allocator.num_total_slots
        owners = np.zeros(self.allocator.num_pages, dtype=np.int64)
        owners[list(self.ref.values())] += 1
        owners[~self.allocator.is_allocated(np.arange(0, total, ps))] += 1
        caller_held = 0
        borrowed: set[Prefix] = set()
        for req in self.reqs:
            own = req.table[req.num_cached :]
            np.add.at(owners, own[::ps] // ps, 1)
            caller_held += own.size
            pages = _ref_match(self.ref, req.tokens[: req.num_cached], ps)
            assert _runs(pages, ps).tolist() == req.table[: req.num_cached].tolist()
            borrowed.update(tuple(req.tokens[: (j + 1) * ps]) for j in range(len(pages)))
        assert (owners == 1).all(), "a page is owned by none or by two of allocator / tree / requests"
        assert len(self.ref) == len(set(self.ref.values()))
        assert self.allocator.num_free_slots + self.cache.cached_slots + caller_held == total
        assert self.cache.cached_slots == len(self.ref) * ps
        assert self.cache.protected_slots == len(borrowed) * ps

    def step(self) -> None:
        op = self.rng.random()
        if op < 0.35 or not self.reqs:
            self.start()
        else:
            req = self.reqs[int(self.rng.integers(len(self.reqs)))]
            if op < 0.6:
                self.finish(req)
            elif op < 0.7:
                self.abort(req)
            elif op < 0.8:
                self.keep_running(req)
            elif op < 0.9:
                self.evict(int(self.rng.integers(-1, 4 * self.ps)))
            else:
                self.check_match(self.random_tokens())
        self.check_invariants()


@pytest.mark.parametrize("page_size", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_check_random_operations(page_size: int, seed: int) -> None:
    model = _Model(page_size, num_pages=48, seed=seed)
    for _ in range(2000):
        model.step()
    # The run exercised what it is meant to.
    assert model.evictions > 20 and model.duplicates_freed > 5 and model.failed_allocs > 0
    for req in list(model.reqs):
        model.abort(req)
    model.check_invariants()
    model.cache.reset()
    assert model.allocator.num_free_slots == model.allocator.num_total_slots


def test_common_prefix_len_of_lists_and_arrays_equals_a_scan() -> None:
    """Lists take the bisecting slice comparison, arrays (or a mix) numpy's: both must give
    the first index where the sequences differ, or the shorter length."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        shared = int(rng.integers(0, 400))
        a = rng.integers(0, 3, size=shared + int(rng.integers(0, 200))).tolist()
        b = a[:shared] + rng.integers(0, 3, size=int(rng.integers(0, 200))).tolist()
        n = min(len(a), len(b))
        expected = next((i for i in range(n) if a[i] != b[i]), n)
        assert common_prefix_len(a, b) == expected
        assert common_prefix_len(np.asarray(a), b) == expected
        assert common_prefix_len(a, np.asarray(b)) == expected
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len((1, 2, 3), [1, 2, 4]) == 2  # a tuple against a list: by value
