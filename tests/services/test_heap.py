"""services/heap.py: what a serving process built at start-up leaves the collector's passes."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from benchmarks.gc_pauses import GcPauses
from services.heap import freeze_long_lived


@pytest.fixture
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # this test process goes on: its frozen objects must be collectable again


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def test_start_up_objects_leave_the_full_passes(thawed: None) -> None:
    long_lived = [Node() for _ in range(1000)]
    assert freeze_long_lived("test") >= len(long_lived)
    assert not any(obj is long_lived for obj in gc.get_objects())  # no pass walks it again
    with GcPauses() as pauses:
        gc.collect()
    assert pauses.full_collections == 1 and pauses.full_max_ms > 0


def test_garbage_of_start_up_is_collected_before_the_freeze(thawed: None) -> None:
    a, b = Node(), Node()
    a.peer, b.peer = b, a  # a cycle only the collector can free; frozen, it never would be
    alive = weakref.ref(a)
    del a, b
    freeze_long_lived("test")
    assert alive() is None
