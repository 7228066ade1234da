"""The KV pool's byte budget (engine/kv/budget.py): `gpu_memory_utilization` exactly, from the
free memory measured before and after the weights load; the other ways to size it unchanged."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.kv.budget import CPU_KV_CAP_BYTES, DeviceMemory, kv_budget_bytes, kv_budget_for_utilization

GIB = 1 << 30


def test_utilization_bounds_weights_plus_kv_by_the_memory_free_at_start() -> None:
    memory = DeviceMemory(free_at_start=80 * GIB, free_after_weights=64 * GIB)  # 16 GiB of weights
    assert kv_budget_for_utilization(0.9, memory) == int(0.9 * 80 * GIB) - 16 * GIB
    assert kv_budget_for_utilization(1.0, memory) == 64 * GIB  # everything the weights left
    # weights + KV never pass the share, whatever the numbers
    for utilization in (0.25, 0.5, 0.75, 0.95):
        budget = kv_budget_for_utilization(utilization, memory)
        assert budget + 16 * GIB == int(utilization * 80 * GIB)


def test_weights_loaded_before_the_engine_started_are_not_counted() -> None:
    """`build_engine_parts(config, loaded=...)`: the weights are in memory already, nothing drops."""
    memory = DeviceMemory(free_at_start=40 * GIB, free_after_weights=40 * GIB)
    assert kv_budget_for_utilization(0.5, memory) == 20 * GIB


def test_memory_freed_by_another_process_while_loading_is_no_negative_weight() -> None:
    memory = DeviceMemory(free_at_start=10 * GIB, free_after_weights=12 * GIB)
    assert kv_budget_for_utilization(0.5, memory) == 5 * GIB
    assert kv_budget_for_utilization(1.0, DeviceMemory(10 * GIB, 8 * GIB + 10 * GIB)) == 10 * GIB


def test_a_share_the_weights_fill_is_refused_with_the_numbers() -> None:
    memory = DeviceMemory(free_at_start=20 * GIB, free_after_weights=4 * GIB)  # 16 GiB of weights
    with pytest.raises(ValueError, match=r"gpu_memory_utilization 0.8 allows 16.00 GiB of the 20.00 GiB free"):
        kv_budget_for_utilization(0.8, memory)
    assert kv_budget_for_utilization(0.85, memory) == int(0.85 * 20 * GIB) - 16 * GIB


def test_the_budget_by_configuration() -> None:
    memory = DeviceMemory(free_at_start=80 * GIB, free_after_weights=60 * GIB)
    ram = 64 * GIB
    assert kv_budget_bytes(EngineConfig(kv_cache_memory_bytes=3 * GIB), memory, ram) == 3 * GIB
    assert kv_budget_bytes(EngineConfig(gpu_memory_utilization=0.5), memory, ram) == 20 * GIB
    assert kv_budget_bytes(EngineConfig(), memory, ram) == int(60 * GIB * 0.6)  # kv_memory_fraction
    assert kv_budget_bytes(EngineConfig(), None, ram) == CPU_KV_CAP_BYTES
    assert kv_budget_bytes(EngineConfig(), None, 8 * GIB) == GIB
    with pytest.raises(ValueError, match="runs on CPU; size it with kv_cache_memory_bytes"):
        kv_budget_bytes(EngineConfig(gpu_memory_utilization=0.5), None, ram)


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01, float("nan")])
def test_engine_config_takes_a_fraction_in_0_1(utilization: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        EngineConfig(gpu_memory_utilization=utilization)


def test_engine_config_refuses_two_sizes_for_the_pool() -> None:
    with pytest.raises(ValueError, match="both size the KV pool"):
        EngineConfig(gpu_memory_utilization=0.9, kv_cache_memory_bytes=GIB)
