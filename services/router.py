"""Choosing the replicas that serve a request (docs/design.md §5). Pure policy: no I/O.

Prefix affinity: prompts are cut into blocks of `block_tokens` tokens and each block gets a
chained hash (it identifies the whole prefix up to its end). A bounded LRU index remembers
which replicas were sent which prefixes; the replica that was sent the longest leading run
of a prompt's blocks most likely still holds that prefix in its prefix cache. The next turn
of a conversation starts with the previous turn's prompt, so it follows its history.

Affinity is balanced against load: the affine replica is taken only while its load is
within `balance_slack` requests of the least-loaded replica and its KV is below the
high-water mark; otherwise the least-loaded replica wins (ties: lower KV usage, then round
robin). Capacity gates admission: a replica at capacity is not chosen for a new request,
and when every healthy replica of a needed pool is at capacity the request is refused
(`AtCapacity`, HTTP 429) instead of queueing without bound. A request already admitted (one
that moves off a lost or draining worker, a hand-off whose decode replica went away, the
later choices of one HTTP request) is never refused for capacity: it goes to the least-loaded
healthy replica even when all are full, so the pool holds at most one request's size past its
capacity and an admitted stream is never cut for lack of room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RouterConfig:
    block_tokens: int = 16  # tokens per hashed prefix block
    max_index_blocks: int = 200_000  # LRU bound of the prefix index (entries)
    min_affinity_tokens: int = 16  # a shorter cached prefix is not worth a detour
    balance_slack: int = 4  # requests of extra load accepted to follow a cached prefix
    kv_high_watermark: float = 0.9  # a replica this full is not chosen for affinity
    skip_prefill_max_tokens: int = 0  # disaggregated: decode directly when <= this many tokens are
    #                                   uncached on the decode replica (0: always prefill first)
    fallback_colocated: bool = True  # with one pool down, the other runs whole requests

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.max_index_blocks < 1:
            raise ValueError(f"max_index_blocks must be >= 1, got {self.max_index_blocks}")
        if self.balance_slack < 0:
            raise ValueError(f"balance_slack must be >= 0, got {self.balance_slack}")
        if not 0.0 < self.kv_high_watermark <= 1.0:
            raise ValueError(f"kv_high_watermark must be in (0, 1], got {self.kv_high_watermark}")


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    healthy: bool
    inflight: int  # requests this gateway has on the replica (admitted, not finished)
    capacity: int  # inflight bound: the engine's batch plus a bounded queue
    num_running: int = 0  # last reported by the engine (includes other gateways' requests)
    num_waiting: int = 0
    kv_usage: float = 0.0
    shared_capacity: bool = False  # the capacity bounds every gateway's requests, not only ours

    @property
    def load(self) -> int:
        return max(self.inflight, self.num_running + self.num_waiting)

    @property
    def full(self) -> bool:
        return (self.load if self.shared_capacity else self.inflight) >= self.capacity


class NoReplicas(Exception):
    """No healthy replica can serve the request (HTTP 503)."""


class AtCapacity(Exception):
    """Every healthy replica of a needed pool is at capacity (HTTP 429)."""


@dataclass(frozen=True)
class Route:
    mode: Literal["colocated", "disaggregated"]
    prefill: str | None  # replica that prefills and hands off; None: `decode` runs it all
    decode: str  # replica that decodes (or serves the whole request)
    cached_tokens: int  # leading prompt tokens the first replica is expected to hold


def prefix_block_hashes(token_ids: Sequence[int], block_tokens: int) -> list[int]:
    """Chained hashes of the full leading blocks: hash i covers tokens [0, (i+1)*block)."""
    hashes: list[int] = []
    prev = 0
    for end in range(block_tokens, len(token_ids) + 1, block_tokens):
        prev = hash((prev, tuple(token_ids[end - block_tokens : end])))
        hashes.append(prev)
    return hashes


class PrefixIndex:
    """Bounded LRU map: prefix-block hash -> replicas that were sent that prefix."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[int, set[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """replica -> number of leading blocks it holds (contiguous from the start)."""
        matched: dict[str, int] = {}
        for depth, block_hash in enumerate(hashes):
            holders = self._entries.get(block_hash)
            if not holders:
                break
            extended = False
            for replica in holders:
                if matched.get(replica, 0) == depth:
                    matched[replica] = depth + 1
                    extended = True
            if not extended:
                break
        return matched

    def insert(self, hashes: Sequence[int], replica: str) -> None:
        for block_hash in hashes:
            holders = self._entries.get(block_hash)
            if holders is None:
                self._entries[block_hash] = {replica}
            else:
                holders.add(replica)
                self._entries.move_to_end(block_hash)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget_replica(self, replica: str) -> None:
        for block_hash in list(self._entries):
            holders = self._entries[block_hash]
            holders.discard(replica)
            if not holders:
                del self._entries[block_hash]


class Router:
    def __init__(self, config: RouterConfig | None = None) -> None:
        self.config = config or RouterConfig()
        self.index = PrefixIndex(self.config.max_index_blocks)
        self._round_robin = 0

    def forget(self, replica_id: str) -> None:
        """The replica lost its cache (restart) or left."""
        self.index.forget_replica(replica_id)

    def route(
        self,
        prompt_token_ids: Sequence[int],
        *,
        colocated: Sequence[ReplicaLoad] = (),
        prefill: Sequence[ReplicaLoad] = (),
        decode: Sequence[ReplicaLoad] = (),
        admitted: bool = False,  # True: never AtCapacity (see the module docstring)
    ) -> Route:
        hashes = prefix_block_hashes(prompt_token_ids, self.config.block_tokens)
        matches = self.index.match(hashes)
        healthy_prefill = [r for r in prefill if r.healthy]
        healthy_decode = [r for r in decode if r.healthy]
        if healthy_prefill and healthy_decode:
            decode_pick, decode_cached = self._pick(healthy_decode, matches, "decode", admitted)
            skip = self.config.skip_prefill_max_tokens
            if skip > 0 and len(prompt_token_ids) - decode_cached <= skip:
                self._remember(hashes, decode_pick.replica_id)
                return Route("colocated", None, decode_pick.replica_id, decode_cached)
            prefill_pick, prefill_cached = self._pick(healthy_prefill, matches, "prefill", admitted)
            self._remember(hashes, prefill_pick.replica_id, decode_pick.replica_id)
            return Route("disaggregated", prefill_pick.replica_id, decode_pick.replica_id, prefill_cached)
        pool = [r for r in colocated if r.healthy]
        if not pool and self.config.fallback_colocated:
            pool = healthy_prefill + healthy_decode
        if not pool:
            raise NoReplicas("no healthy workers")
        pick, cached = self._pick(pool, matches, "worker", admitted)
        self._remember(hashes, pick.replica_id)
        return Route("colocated", None, pick.replica_id, cached)

    def pick_decode(self, decode: Sequence[ReplicaLoad], prompt_token_ids: Sequence[int]) -> str:
        """A decode replica for a hand-off whose planned replica went away (the request was
        admitted: a full replica is taken rather than none)."""
        healthy = [r for r in decode if r.healthy]
        if not healthy:
            raise NoReplicas("no healthy decode workers")
        hashes = prefix_block_hashes(prompt_token_ids, self.config.block_tokens)
        pick, _ = self._pick(healthy, self.index.match(hashes), "decode", admitted=True)
        self._remember(hashes, pick.replica_id)
        return pick.replica_id

    def _remember(self, hashes: list[int], *replicas: str) -> None:
        for replica in replicas:
            self.index.insert(hashes, replica)

    def _pick(
        self, healthy: Sequence[ReplicaLoad], matches: dict[str, int], pool: str, admitted: bool
    ) -> tuple[ReplicaLoad, int]:
        available = [r for r in healthy if not r.full]
        if not available:
            if not admitted:
                raise AtCapacity(f"all {len(healthy)} {pool} replicas are at capacity")
            available = list(healthy)
        block = self.config.block_tokens
        least_load = min(r.load for r in available)
        affine = max(available, key=lambda r: (matches.get(r.replica_id, 0), -r.load, -r.kv_usage))
        affine_tokens = matches.get(affine.replica_id, 0) * block
        if (
            affine_tokens >= self.config.min_affinity_tokens
            and affine.load <= least_load + self.config.balance_slack
            and affine.kv_usage < self.config.kv_high_watermark
        ):
            return affine, affine_tokens
        best_key = min((r.load, r.kv_usage) for r in available)
        ties = [r for r in available if (r.load, r.kv_usage) == best_key]
        pick = ties[self._round_robin % len(ties)]
        self._round_robin += 1
        return pick, matches.get(pick.replica_id, 0) * block
