"""Host-side KV bookkeeping for requests: slot allocation, the prefix cache and the
request → slot table, behind four verbs (admit, reserve, release, usage).

Ownership: a request owns the slots of its table row from `num_cached` to `num_allocated`;
the prefix cache owns the first `num_cached` (locked while the request lives). On release
the request offers its computed tokens to the prefix cache, which takes whole pages, and the
rest go back to the allocator. A request still prefilling hands its launched whole pages
to the prefix cache early (`share_computed`), so requests sharing its prefix attach to them
instead of computing them again. Nothing here touches device memory except the table copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.kv.allocator import SlotAllocator
from engine.kv.radix import NullPrefixCache, RadixCache
from engine.kv.req_table import ReqToTokenTable
from engine.request import Request


@dataclass(frozen=True)
class KVUsage:
    used_slots: int  # held by live requests (not reclaimable)
    cached_slots: int  # held by the prefix cache and evictable
    total_slots: int

    @property
    def ratio(self) -> float:
        return self.used_slots / self.total_slots if self.total_slots else 0.0


class KVManager:
    def __init__(
        self, num_slots: int, page_size: int, max_rows: int, max_context: int, enable_prefix_cache: bool, device: object
    ) -> None:
        self.page_size = page_size
        self.allocator = SlotAllocator(num_slots // page_size, page_size)
        self.prefix_cache: RadixCache | NullPrefixCache = (
            RadixCache(page_size, self.allocator) if enable_prefix_cache else NullPrefixCache()
        )
        self.table = ReqToTokenTable(
            max_rows,
            max_context,
            device,  # type: ignore[arg-type]
            sink_slot=self.allocator.num_total_slots,
        )
        self.prefix_hits_total = 0  # prompt tokens served from the cache
        self.prefix_queries_total = 0  # prompt tokens looked up

    def _round_up(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def _alloc(self, num_slots: int) -> np.ndarray | None:
        slots = self.allocator.alloc(num_slots)
        if slots is None:
            self.prefix_cache.evict(num_slots - self.allocator.num_free_slots)
            slots = self.allocator.alloc(num_slots)
        return slots

    def can_admit(self, num_tokens: int) -> bool:
        free = self.allocator.num_free_slots + self.prefix_cache.evictable_slots
        return self.table.num_free_rows > 0 and free >= self._round_up(num_tokens)

    def admit(self, req: Request, fill_ids: list[int], reserve_to: int, *, use_prefix_cache: bool = True) -> bool:
        """Give `req` a table row, its cached prefix (none without `use_prefix_cache`) and
        slots for positions [0, reserve_to). Returns False (and changes nothing) when memory
        is short."""
        row = self.table.alloc_row()
        if row is None:
            return False
        # Keep at least one token to compute: its logits sample the next token.
        lookup = fill_ids[: len(fill_ids) - 1] if use_prefix_cache else []
        match = self.prefix_cache.match_prefix(lookup)
        cached = len(match.slots)
        self.prefix_cache.lock(match.node)
        slots = self._alloc(self._round_up(reserve_to) - cached)
        if slots is None:
            self.prefix_cache.unlock(match.node)
            self.table.free_row(row)
            return False
        self.table.write(row, 0, np.concatenate((match.slots, slots)))
        req.row = row
        req.num_cached = cached
        req.prefix_node = match.node
        req.num_allocated = cached + len(slots)
        if use_prefix_cache:
            self.prefix_queries_total += len(fill_ids)
            self.prefix_hits_total += cached
        return True

    def reserve(self, req: Request, upto: int) -> bool:
        """Make positions [0, upto) of `req` backed by slots (grows by whole pages)."""
        if upto <= req.num_allocated:
            return True
        if upto > self.table.max_context:
            return False
        slots = self._alloc(self._round_up(upto) - req.num_allocated)
        if slots is None:
            return False
        self.table.write(req.row, req.num_allocated, slots)
        req.num_allocated += len(slots)
        return True

    @property
    def caches_prefixes(self) -> bool:
        return isinstance(self.prefix_cache, RadixCache)

    def cached_prefix_len(self, fill_ids: list[int]) -> int:
        """Positions of `fill_ids` an admission now would take from the prefix cache."""
        return self.prefix_cache.match_prefix(fill_ids[: len(fill_ids) - 1]).num_tokens

    def share_computed(self, req: Request, fill_ids: list[int], num_tokens: int) -> None:
        """Hand the whole pages of `req`'s first `num_tokens` positions (KV launched, not
        necessarily computed yet: later steps run after it) to the prefix cache while the
        request keeps running, and take the cache's pages back as the start of its table
        (the RadixCache.insert contract). Afterwards the cache owns positions
        [0, req.num_cached). Where the cache already held some of these tokens under other
        pages (two requests computed them, e.g. one scoring its prompt), the request moves
        to the cache's pages and the step being launched rewrites them with the same KV."""
        n = num_tokens - num_tokens % self.page_size
        if not self.caches_prefixes or n <= req.num_cached:
            return
        slots = self.table.slots(req.row, 0, n).astype(np.int64)
        prefix = np.asarray(fill_ids[:n], dtype=np.int64)  # converted once for both calls
        self.prefix_cache.insert(prefix, slots)
        match = self.prefix_cache.match_prefix(prefix)
        self.prefix_cache.lock(match.node)
        if req.prefix_node is not None:
            self.prefix_cache.unlock(req.prefix_node)
        if not np.array_equal(match.slots, slots):
            self.table.write(req.row, 0, match.slots)
        req.prefix_node = match.node
        req.num_cached = match.num_tokens

    def release(self, req: Request, token_ids: list[int], kv_len: int) -> None:
        """Free `req`'s row and slots. Its first min(kv_len, len(token_ids)) positions hold
        valid KV for `token_ids`; the prefix cache keeps the whole pages of them."""
        if req.row < 0:
            return
        slots = self.table.slots(req.row, 0, req.num_allocated).astype(np.int64)
        n_valid = min(kv_len, len(token_ids), req.num_allocated)
        owned = self.prefix_cache.insert(token_ids[:n_valid], slots[:n_valid])
        owned = max(owned, req.num_cached)
        if owned < req.num_allocated:
            self.allocator.free(slots[owned:])
        if req.prefix_node is not None:
            self.prefix_cache.unlock(req.prefix_node)
        self.table.free_row(req.row)
        req.row = -1
        req.prefix_node = None
        req.num_allocated = 0
        req.num_cached = 0

    def usage(self) -> KVUsage:
        total = self.allocator.num_total_slots
        cached = self.prefix_cache.evictable_slots
        used = total - self.allocator.num_free_slots - cached
        return KVUsage(used_slots=used, cached_slots=cached, total_slots=total)
