"""What a worker counts as waiting beyond its engine's own queues (the gauge the planner reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core import EngineStats
    from services.workers.types import Role


def pending_handoffs(role: Role, stats: EngineStats, num_held: int, receiving: int) -> int:
    """Hand-offs accepted by a worker that wait for a decode slot: KV still being fetched
    (`receiving`, receive_kv), and installed requests the engine holds (`num_held`) in neither
    scheduler queue yet (its hand-off queue). On a prefill worker the held requests are
    finished prefills waiting for a decode worker to take them: not waiting there."""
    if role == "prefill":
        return receiving
    queued = num_held - stats.num_running - stats.num_waiting
    return receiving + max(0, queued)
