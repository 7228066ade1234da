"""benchmarks/step_floor.py: the floor of a step's token mix, against the same sums written out."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.engine_gpu import LLAMA3_8B
from benchmarks.step_floor import StepMix, linear_weights_per_layer, step_floor

COPY = 3.0e12  # bytes/s
PEAK = 800e12  # FLOP/s


def test_linear_weights_of_llama3_8b() -> None:
    # q 4096x4096, k and v 4096x1024 each, o 4096x4096, gate, up and down 4096x14336
    assert linear_weights_per_layer(LLAMA3_8B) == 4096 * (4096 + 2048) + 4096 * 4096 + 3 * 4096 * 14336


def test_floor_of_a_mixed_step() -> None:
    mix = StepMix(
        decode_rows=100, prefill_tokens=300, decode_own_keys=500, chunks=2, chunk_context=2000, shared_keys=2048
    )
    floor = step_floor(LLAMA3_8B, mix, COPY, PEAK)
    layers, head = linear_weights_per_layer(LLAMA3_8B) * 32, 4096 * 128256
    assert floor.linear_ms == pytest.approx(1e3 * 2 * (layers * 400 + head * 100) / PEAK)
    assert floor.weights_ms == pytest.approx(1e3 * 2 * (layers + head) / COPY)
    kv_per_key = 2 * 32 * 8 * 128 * 2
    keys = 2048 + 100 * 500 + 2 * 2000 + 300  # shared once, own keys, each chunk's context once
    assert floor.kv_ms == pytest.approx(1e3 * keys * kv_per_key / COPY)
    pairs = 100 * (2048 + 500) + 300 * (2000 + 150 / 2)
    assert floor.attention_ms == pytest.approx(1e3 * 4 * 32 * 128 * pairs * 32 / PEAK)
    assert floor.total_ms == pytest.approx(max(floor.linear_ms, floor.weights_ms) + floor.kv_ms + floor.attention_ms)


def test_small_steps_are_bound_by_the_weight_stream() -> None:
    decode_only = StepMix(
        decode_rows=1, prefill_tokens=0, decode_own_keys=100, chunks=0, chunk_context=0, shared_keys=0
    )
    floor = step_floor(LLAMA3_8B, decode_only, COPY, PEAK)
    assert floor.weights_ms > floor.linear_ms
    more_rows = step_floor(LLAMA3_8B, dataclasses.replace(decode_only, decode_rows=64), COPY, PEAK)
    assert more_rows.kv_ms == pytest.approx(64 * floor.kv_ms)
