"""Prefix cache: a radix tree over token ids whose values are KV slot ids (host only).

The tree caches whole pages only. Every node's key is a run of token ids whose length is a
multiple of `page_size`, and its value holds the slot ids of those tokens, as page runs
(see engine.kv.allocator); children are indexed by their first page of token ids. So the
tree is, in effect, a map from page-aligned token prefixes to the pages holding their KV,
stored with shared prefixes merged (the SGLang RadixAttention layout, page-granular).

Ownership of slots, the one rule everything else follows from:

- Every slot is owned by exactly one of: the allocator (free), the tree, or one request.
- Slots the tree owns stay valid while the tree holds them. Requests *borrow* a cached prefix
  with `match_prefix` + `lock`; a locked node (and so its whole path to the root) is never
  evicted. `unlock` returns the borrow; the tree keeps the slots.
- A request hands its own slots to the tree with `insert`; the tree then owns the whole
  pages of the inserted tokens (freeing any the tree already had under other ids), and the
  request frees the rest itself.
- Only `evict` and `reset` give tree slots back to the allocator.

LRU recency is a logical clock, bumped by every `match_prefix` and `insert` along the path
they touch, so eviction order is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.kv.allocator import SlotAllocator
from engine.kv.token_prefix import common_prefix_len

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


class RadixNode:
    """One edge of the tree plus the node under it. Opaque to callers: a handle to `lock`
    and `unlock`. The root has an empty key and is never evicted or locked."""

    __slots__ = ("key", "value", "parent", "children", "lock_ref", "last_access", "node_id", "alive")

    def __init__(
        self,
        key: np.ndarray,
        value: np.ndarray,
        parent: RadixNode | None,
        node_id: int,
        last_access: int = 0,
        lock_ref: int = 0,
    ) -> None:
        self.key = key  # [n] int64 token ids, n a multiple of page_size
        self.value = value  # [n] int64 slot ids of those tokens (page runs)
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}  # by first page of the child's key
        self.lock_ref = lock_ref  # live borrows through this node (>= every child's)
        self.last_access = last_access
        self.node_id = node_id  # tie-break for equal recency
        self.alive = True  # False once evicted: a stale handle


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached page-aligned prefix of a query. `slots` is a fresh `[n] int64`
    array (n a multiple of page_size), the KV slots of the first n query tokens, still owned
    by the tree: the caller must `lock(node)` before anything may evict, and must not free
    them. `node` is the handle of the last matched node (the root when n == 0)."""

    slots: np.ndarray
    node: RadixNode

    @property
    def num_tokens(self) -> int:
        return int(self.slots.size)


class PrefixCache(Protocol):
    """What the scheduler uses; `RadixCache` and `NullPrefixCache` both provide it."""

    def match_prefix(self, token_ids: Sequence[int] | np.ndarray) -> PrefixMatch: ...
    def lock(self, node: RadixNode) -> None: ...
    def unlock(self, node: RadixNode) -> None: ...
    def insert(self, token_ids: Sequence[int] | np.ndarray, slots: np.ndarray) -> int: ...
    def evict(self, num_slots: int) -> int: ...
    def reset(self) -> None: ...
    @property
    def evictable_slots(self) -> int: ...
    @property
    def cached_slots(self) -> int: ...
    @property
    def protected_slots(self) -> int: ...


def _as_token_array(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    tokens = np.asarray(token_ids, dtype=np.int64)
    if tokens.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {tokens.shape}")
    return tokens


class RadixCache:
    """Page-granular radix tree prefix cache over the slots of `allocator`."""

    def __init__(self, page_size: int, allocator: SlotAllocator) -> None:
        if page_size != allocator.page_size:
            raise ValueError(f"page_size {page_size} differs from the allocator's {allocator.page_size}")
        self.page_size = page_size
        self.allocator = allocator
        self._ids = itertools.count()
        self._clock = 0
        self._root = RadixNode(_EMPTY, _EMPTY, None, next(self._ids))
        self._cached = 0  # slots held by the tree
        self._evictable = 0  # of those, slots in nodes with lock_ref == 0
        self._page_in_tree = np.zeros(allocator.num_pages, dtype=bool)  # guards the ownership rule

    # ------------------------------------------------------------------ queries

    @property
    def cached_slots(self) -> int:
        """Slots the tree owns (locked or not)."""
        return self._cached

    @property
    def evictable_slots(self) -> int:
        """Slots `evict` could free now: those of unlocked nodes."""
        return self._evictable

    @property
    def protected_slots(self) -> int:
        """Slots of locked nodes, borrowed by live requests."""
        return self._cached - self._evictable

    def match_prefix(self, token_ids: Sequence[int] | np.ndarray) -> PrefixMatch:
        """Longest cached prefix of `token_ids` in whole pages (the trailing partial page is
        never matched). Marks the matched path as most recently used. Does not lock: call
        `lock(match.node)` before the next `evict`/`reset`, or the slots may be freed.
        A caller that needs at least one token left to compute passes `token_ids[:-1]`."""
        tokens = _as_token_array(token_ids)
        tokens = tokens[: tokens.size - tokens.size % self.page_size]
        now = self._tick()
        node = self._root
        values: list[np.ndarray] = []
        pos = 0
        while pos < tokens.size:
            child = node.children.get(self._page_key(tokens, pos))
            if child is None:
                break
            matched = self._match_len(child.key, tokens[pos:])
            full_edge = matched == child.key.size
            if not full_edge:
                child = self._split(child, matched)
            child.last_access = now
            values.append(child.value)
            node = child
            pos += matched
            if not full_edge:
                break
        slots = np.concatenate(values) if values else np.zeros(0, dtype=np.int64)
        return PrefixMatch(slots, node)

    # ------------------------------------------------------------------ borrowing

    def lock(self, node: RadixNode) -> None:
        """Borrow the prefix ending at `node`: it and its ancestors become unevictable until
        the matching `unlock`. Locks nest (reference counts)."""
        if not node.alive:
            raise RuntimeError("lock() on an evicted prefix-cache node; lock right after match_prefix")
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= node.key.size
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """Return one borrow taken by `lock(node)`. The tree keeps the slots."""
        if node.parent is not None and node.lock_ref <= 0:
            raise RuntimeError("unlock() of a prefix-cache node that is not locked")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += node.key.size
            node = node.parent

    # ------------------------------------------------------------------ ownership transfer

    def insert(self, token_ids: Sequence[int] | np.ndarray, slots: np.ndarray) -> int:
        """Hand the KV of `token_ids` to the tree. `slots[i]` holds the KV of `token_ids[i]`
        (page runs, as the request's slot table has them; `len(slots) >= n` where
        `n = len(token_ids) // page_size * page_size`). Returns n.

        Ownership after the call, for positions `i < n`: the tree owns the slot of every
        position. Where the tree already cached position i under the *same* page (the
        caller's own borrowed prefix), nothing changes. Where it cached it under a
        *different* page (another request computed the same tokens), the tree keeps its page
        and frees the caller's page to the allocator itself. Otherwise the tree adopts the
        caller's page. Positions `i >= n` (the partial last page and anything beyond) stay
        the caller's: it frees `slots[n:]` itself, and must never free `slots[:n]`.

        Borrows are untouched: a caller still holding `lock(old_node)` must `unlock` it as
        usual. A request that keeps running after inserting must stop using `slots[:n]`
        (some may now be free): `match_prefix` again, `lock` the new node, `unlock` the old
        one, and take the match's slots as the start of its slot table.

        Raises ValueError (changing nothing but internal node splits) if the slots are not
        page runs, repeat a page, or would take or free a page the tree already owns
        elsewhere, or a free page."""
        tokens = _as_token_array(token_ids)
        slots = np.asarray(slots, dtype=np.int64)
        n = tokens.size - tokens.size % self.page_size
        if slots.ndim != 1 or slots.size < n:
            raise ValueError(f"insert() needs a slot for each of the first {n} tokens, got {slots.shape}")
        if n == 0:
            return 0
        tokens, slots = tokens[:n], slots[:n]
        ps = self.page_size
        pages = self.allocator.pages_of(slots)
        if np.unique(pages).size != pages.size:
            raise ValueError("insert() slots use the same page twice")
        now = self._tick()
        node = self._root
        duplicates: list[np.ndarray] = []
        pos = 0
        while pos < n:
            child = node.children.get(self._page_key(tokens, pos))
            if child is None:
                break
            matched = self._match_len(child.key, tokens[pos:])
            if matched < child.key.size:
                child = self._split(child, matched)
            child.last_access = now
            mine = pages[pos // ps : (pos + matched) // ps]
            differ = child.value[::ps] // ps != mine
            if differ.any():
                duplicates.append(mine[differ])
            node = child
            pos += matched

        dup_pages = np.concatenate(duplicates) if duplicates else _EMPTY
        new_pages = pages[pos // ps :]
        if self._page_in_tree[dup_pages].any() or self._page_in_tree[new_pages].any():
            raise ValueError("insert() slots include pages the prefix cache already owns elsewhere")
        if not self.allocator.is_allocated(slots[pos::ps]).all():
            raise ValueError("insert() slots include free pages")
        if dup_pages.size:
            self.allocator.free(self._page_runs(dup_pages))
        if pos < n:
            leaf = RadixNode(tokens[pos:].copy(), slots[pos:].copy(), node, next(self._ids), now)
            node.children[self._page_key(leaf.key, 0)] = leaf
            self._page_in_tree[new_pages] = True
            self._cached += n - pos
            self._evictable += n - pos
        return n

    def evict(self, num_slots: int) -> int:
        """Free least-recently-used unlocked leaves (whole nodes; a parent becomes a leaf
        when its last child goes) until at least `num_slots` slots were freed or nothing
        evictable is left. Returns the number of slots freed to the allocator."""
        if num_slots <= 0:
            return 0
        heap = [(leaf.last_access, leaf.node_id, leaf) for leaf in self._leaves() if leaf.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[np.ndarray] = []
        num_freed = 0
        while heap and num_freed < num_slots:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._page_key(leaf.key, 0)]
            leaf.alive = False
            freed.append(leaf.value)
            num_freed += leaf.value.size
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        if freed:
            self._release(np.concatenate(freed))
        return num_freed

    def reset(self) -> None:
        """Drop every cached prefix, freeing its slots. Raises RuntimeError while any prefix
        is locked (a live request still reads those slots)."""
        if self.protected_slots:
            raise RuntimeError(f"reset() with {self.protected_slots} prefix-cache slots still locked")
        values = [n.value for n in self._nodes() if n is not self._root]
        for node in self._nodes():
            node.alive = False
        self._root = RadixNode(_EMPTY, _EMPTY, None, next(self._ids))
        if values:
            self._release(np.concatenate(values))

    # ------------------------------------------------------------------ internals

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _page_key(self, tokens: np.ndarray, pos: int) -> tuple[int, ...]:
        return tuple(tokens[pos : pos + self.page_size].tolist())

    def _match_len(self, key: np.ndarray, tokens: np.ndarray) -> int:
        """Length of the common prefix of `key` and `tokens`, rounded down to whole pages."""
        common = common_prefix_len(key, tokens)
        return common - common % self.page_size

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node`'s edge after `at` tokens (0 < at < len, a page multiple); returns the
        new upper node. `node` keeps its identity as the lower part, so handles stay valid."""
        parent = node.parent
        assert parent is not None and 0 < at < node.key.size
        upper = RadixNode(node.key[:at], node.value[:at], parent, next(self._ids), node.last_access, node.lock_ref)
        parent.children[self._page_key(node.key, 0)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._page_key(node.key, 0)] = node
        return upper

    def _release(self, slots: np.ndarray) -> None:
        """Free unlocked tree slots back to the allocator."""
        pages = slots[:: self.page_size] // self.page_size
        self._page_in_tree[pages] = False
        self._cached -= slots.size
        self._evictable -= slots.size
        self.allocator.free(slots)

    def _page_runs(self, pages: np.ndarray) -> np.ndarray:
        return (pages[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1)

    def _nodes(self) -> list[RadixNode]:
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _leaves(self) -> list[RadixNode]:
        return [n for n in self._nodes() if not n.children and n is not self._root]


class NullPrefixCache:
    """The prefix cache switched off, with `RadixCache`'s interface so the scheduler needs no
    branches: nothing matches, `insert` adopts nothing (returns 0, so the caller frees all
    its slots), nothing is ever cached or evicted."""

    def __init__(self) -> None:
        self._root = RadixNode(_EMPTY, _EMPTY, None, 0)

    @property
    def cached_slots(self) -> int:
        return 0

    @property
    def evictable_slots(self) -> int:
        return 0

    @property
    def protected_slots(self) -> int:
        return 0

    def match_prefix(self, token_ids: Sequence[int] | np.ndarray) -> PrefixMatch:
        return PrefixMatch(np.zeros(0, dtype=np.int64), self._root)

    def lock(self, node: RadixNode) -> None:
        pass

    def unlock(self, node: RadixNode) -> None:
        pass

    def insert(self, token_ids: Sequence[int] | np.ndarray, slots: np.ndarray) -> int:
        return 0

    def evict(self, num_slots: int) -> int:
        return 0

    def reset(self) -> None:
        pass
