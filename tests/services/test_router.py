"""Router policy: prefix affinity, load balance, capacity, pools and fallbacks."""

from __future__ import annotations

import pytest

from services.router import (
    AtCapacity,
    NoReplicas,
    PrefixIndex,
    ReplicaLoad,
    Router,
    RouterConfig,
    prefix_block_hashes,
)


def replica(
    rid: str,
    inflight: int = 0,
    capacity: int = 8,
    healthy: bool = True,
    kv: float = 0.0,
    running: int = 0,
    waiting: int = 0,
) -> ReplicaLoad:
    return ReplicaLoad(rid, healthy, inflight, capacity, running, waiting, kv)


def prompt(prefix: int, length: int) -> list[int]:
    return [prefix * 1000 + i for i in range(length)]


def test_block_hashes_are_chained_and_cover_full_blocks_only() -> None:
    a = prefix_block_hashes(list(range(40)), 16)
    b = prefix_block_hashes(list(range(32)) + [99] * 8, 16)
    c = prefix_block_hashes([7] + list(range(1, 40)), 16)
    assert len(a) == 2 and a == b  # the partial third block is not hashed
    assert a[0] != c[0] and a[1] != c[1]  # a change early changes every later hash
    assert prefix_block_hashes(list(range(15)), 16) == []


def test_prefix_index_matches_contiguous_leading_blocks() -> None:
    index = PrefixIndex(100)
    hashes = prefix_block_hashes(prompt(1, 64), 16)
    index.insert(hashes[:2], "r1")
    index.insert(hashes, "r2")
    assert index.match(hashes) == {"r1": 2, "r2": 4}
    assert index.match(prefix_block_hashes(prompt(2, 64), 16)) == {}
    index.forget_replica("r2")
    assert index.match(hashes) == {"r1": 2}


def test_prefix_index_is_bounded_lru() -> None:
    index = PrefixIndex(4)
    for conversation in range(10):
        index.insert(prefix_block_hashes(prompt(conversation, 32), 16), f"r{conversation}")
    assert len(index) == 4
    assert index.match(prefix_block_hashes(prompt(9, 32), 16)) == {"r9": 2}
    assert index.match(prefix_block_hashes(prompt(0, 32), 16)) == {}


def test_next_turn_goes_where_its_history_is_cached() -> None:
    router = Router(RouterConfig(block_tokens=16))
    pool = [replica("a"), replica("b"), replica("c")]
    first = router.route(prompt(1, 100), colocated=pool)
    # other conversations spread over the replicas
    others = {router.route(prompt(k, 100), colocated=pool).decode for k in range(2, 8)}
    assert len(others) > 1
    turn2 = prompt(1, 100) + prompt(50, 40)
    assert router.route(turn2, colocated=pool).decode == first.decode
    assert router.route(turn2, colocated=pool).cached_tokens >= 96


def test_affinity_yields_to_load_imbalance() -> None:
    router = Router(RouterConfig(block_tokens=16, balance_slack=2))
    history = prompt(1, 64)
    assert router.route(history, colocated=[replica("a"), replica("b", inflight=1)]).decode == "a"
    within_slack = [replica("a", inflight=3), replica("b", inflight=1)]
    assert router.route(history + [4], colocated=within_slack).decode == "a"
    busy = [replica("a", inflight=6), replica("b", inflight=1)]
    assert router.route(history + [1, 2, 3], colocated=busy).decode == "b"
    # now both hold the history: the less loaded one wins the tie
    assert router.route(history + [5], colocated=[replica("a", inflight=2), replica("b")]).decode == "b"


def test_affinity_skips_replica_with_full_kv() -> None:
    router = Router(RouterConfig(block_tokens=16, kv_high_watermark=0.9))
    history = prompt(1, 64)
    router.route(history, colocated=[replica("a"), replica("b", inflight=1)])
    assert router.route(history, colocated=[replica("a", kv=0.95), replica("b")]).decode == "b"


def test_engine_reported_load_counts_other_gateways() -> None:
    router = Router()
    pool = [replica("a", running=10, waiting=5), replica("b", running=1)]
    assert router.route(prompt(3, 8), colocated=pool).decode == "b"


def test_ties_rotate() -> None:
    router = Router()
    pool = [replica("a"), replica("b"), replica("c")]
    picks = [router.route(prompt(k, 4), colocated=pool).decode for k in range(6)]
    assert sorted(set(picks)) == ["a", "b", "c"]


def test_full_replicas_are_never_chosen_and_all_full_is_overload() -> None:
    router = Router()
    assert router.route(prompt(1, 8), colocated=[replica("a", inflight=8), replica("b", inflight=7)]).decode == "b"
    with pytest.raises(AtCapacity):
        router.route(prompt(1, 8), colocated=[replica("a", inflight=8), replica("b", inflight=9)])


def test_an_admitted_request_goes_to_the_least_loaded_full_replica() -> None:
    """Capacity gates admission only: a request already admitted (a migration, a later choice
    of one request) may fill a replica past it, by at most its own size."""
    router = Router()
    full = [replica("a", inflight=9), replica("b", inflight=8)]
    assert router.route(prompt(1, 8), colocated=full, admitted=True).decode == "b"
    route = router.route(
        prompt(1, 8), prefill=[replica("p", inflight=8)], decode=[replica("d", inflight=8)], admitted=True
    )
    assert (route.prefill, route.decode) == ("p", "d")
    assert router.pick_decode([replica("d0", inflight=9), replica("d1", inflight=8)], prompt(1, 8)) == "d1"
    with pytest.raises(NoReplicas):
        router.route(prompt(1, 8), colocated=[replica("a", healthy=False)], admitted=True)


def test_no_healthy_replica_is_no_replicas() -> None:
    router = Router()
    with pytest.raises(NoReplicas):
        router.route(prompt(1, 8), colocated=[replica("a", healthy=False)])
    with pytest.raises(NoReplicas):
        router.route(prompt(1, 8))


def test_disaggregated_picks_one_of_each_pool() -> None:
    router = Router()
    route = router.route(
        prompt(1, 40),
        prefill=[replica("p0"), replica("p1", inflight=2)],
        decode=[replica("d0", inflight=3), replica("d1")],
    )
    assert route.mode == "disaggregated" and route.prefill == "p0" and route.decode == "d1"


def test_disaggregated_overload_in_either_pool() -> None:
    router = Router()
    with pytest.raises(AtCapacity):
        router.route(prompt(1, 8), prefill=[replica("p", inflight=8)], decode=[replica("d")])
    with pytest.raises(AtCapacity):
        router.route(prompt(1, 8), prefill=[replica("p")], decode=[replica("d", inflight=8)])


def test_one_pool_down_falls_back_to_the_other() -> None:
    router = Router()
    route = router.route(prompt(1, 8), prefill=[replica("p")], decode=[replica("d", healthy=False)])
    assert route == router.route(prompt(1, 8), prefill=[replica("p")], decode=[replica("d", healthy=False)])
    assert route.mode == "colocated" and route.prefill is None and route.decode == "p"
    strict = Router(RouterConfig(fallback_colocated=False))
    with pytest.raises(NoReplicas):
        strict.route(prompt(1, 8), prefill=[replica("p")], decode=[replica("d", healthy=False)])


def test_short_uncached_suffix_skips_prefill_when_enabled() -> None:
    router = Router(RouterConfig(block_tokens=16, skip_prefill_max_tokens=32))
    history = prompt(1, 128)
    first = router.route(history, prefill=[replica("p")], decode=[replica("d")])
    assert first.mode == "disaggregated"
    follow_up = router.route(history + [5] * 20, prefill=[replica("p")], decode=[replica("d")])
    assert follow_up.mode == "colocated" and follow_up.decode == "d" and follow_up.prefill is None
    long_follow_up = router.route(history + [6] * 100, prefill=[replica("p")], decode=[replica("d")])
    assert long_follow_up.mode == "disaggregated"


def test_pick_decode_for_a_handoff() -> None:
    router = Router()
    assert router.pick_decode([replica("d0", healthy=False), replica("d1")], prompt(1, 8)) == "d1"
    with pytest.raises(NoReplicas):
        router.pick_decode([replica("d0", healthy=False)], prompt(1, 8))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        RouterConfig(block_tokens=0)
    with pytest.raises(ValueError, match="kv_high_watermark"):
        RouterConfig(kv_high_watermark=1.5)
