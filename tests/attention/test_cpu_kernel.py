"""The compiled CPU attention kernel (engine/kernels/cpu/attention.py) at the model's shapes,
its KV store, when it takes a forward, and its build falling back to torch.

(Its agreement with the float64 reference on every scenario, NaN-poisoned caches included, is
in test_attention_torch.py, which runs each case on both paths.)"""

from __future__ import annotations

import logging

import pytest
import torch
from attention_cases import make_case, reference_attention, scenario_case, stored_caches_float64, tolerance

from engine.attention import TorchAttentionBackend
from engine.kernels.cpu import build
from engine.kernels.cpu.attention import MAX_EXTEND, CpuPagedAttention

pytestmark = pytest.mark.skipif(not CpuPagedAttention().built, reason="no C compiler: the kernel cannot be built")


def both_paths(case) -> tuple[torch.Tensor, torch.Tensor]:
    outs = []
    for cpu_kernel in (False, True):
        k_cache, v_cache = case.clone_caches()
        outs.append(
            TorchAttentionBackend(cpu_kernel=cpu_kernel).forward(
                case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale
            )
        )
    return outs[0], outs[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_kernel_matches_torch_path_at_model_shapes(window: int, dtype: torch.dtype, seed: int):
    """SmolLM2's heads (9 q / 3 kv, D 64), 16 requests with contexts up to ~300 spread over a
    shuffled pool: decode (1), a short and a full DSpark verify window."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 300, (16,), generator=gen).tolist()
    case = make_case(seed, [window] * 16, prefix, num_q_heads=9, num_kv_heads=3, head_dim=64, uniform=True, dtype=dtype)
    torch_out, kernel_out = both_paths(case)
    torch.testing.assert_close(kernel_out, torch_out, **tolerance(dtype))


@pytest.mark.skipif(not CpuPagedAttention().uses_amx, reason="no AMX tiles: bf16 tasks take the generic loop")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (9, 3), (16, 2), (16, 1)], ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
@pytest.mark.parametrize("scenario", ["decode", "verify", "drafter", "mixed"])
def test_amx_tasks_match_float64(scenario: str, heads: tuple[int, int], head_dim: int, seed: int):
    """bf16 at head_dim 64/128 runs on the tiles: groups of 1-16 query heads (8, 5, 2 and 1
    positions per task), causal and not, contexts past one 32-key block, NaN-poisoned unused
    cache rows (a gathered row outside the context would spread NaN)."""
    shape = {"num_q_heads": heads[0], "num_kv_heads": heads[1], "head_dim": head_dim, "dtype": torch.bfloat16}
    if scenario == "mixed":  # ragged extends of 1-8 rows, one request with no context before it
        case = make_case(seed, [1, 5, 8, 2, 7], [0, 40, 70, 33, 1], bound_slack=0, **shape)
    else:
        case = scenario_case(scenario, seed, max_len=70, **shape)
    assert CpuPagedAttention().serves(case.q, case.k_cache, case.meta)
    _, kernel_out = both_paths(case)
    torch.testing.assert_close(kernel_out.double(), reference_attention(case), **tolerance(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_every_real_slot_and_skips_minus_one(dtype: torch.dtype, seed: int):
    case = scenario_case("ragged-causal", seed, page_size=16, dtype=dtype)
    kernel = CpuPagedAttention()
    assert kernel.stores(case.k, case.v, case.k_cache, case.meta.out_slots)
    k_cache, v_cache = case.clone_caches()
    kernel.store_kv(case.k, case.v, k_cache, v_cache, case.meta.out_slots)
    k_ref, v_ref = stored_caches_float64(case)
    torch.testing.assert_close(k_cache.double(), k_ref, equal_nan=True, atol=0, rtol=0)  # sink untouched too
    torch.testing.assert_close(v_cache.double(), v_ref, equal_nan=True, atol=0, rtol=0)


def test_kernel_takes_short_extends_only(seed: int):
    kernel = CpuPagedAttention()
    short = scenario_case("verify", seed)
    assert kernel.serves(short.q, short.k_cache, short.meta)
    long = make_case(seed, [MAX_EXTEND + 1, 2], [0, 5])
    assert not kernel.serves(long.q, long.k_cache, long.meta)
    half = scenario_case("decode", seed, dtype=torch.float16)
    assert not kernel.serves(half.q, half.k_cache, half.meta)  # fp16: the torch path


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DSPARK_CPU_KERNELS", "0")
    build.load.cache_clear()
    try:
        assert not CpuPagedAttention().built
    finally:
        build.load.cache_clear()


def test_failed_build_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))  # no cached library to find
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    build.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="engine.kernels.cpu.build"):
            assert not CpuPagedAttention().built
        assert "fall back to torch" in caplog.text and "failed" in caplog.text
        case = scenario_case("decode", 0)
        out, _ = both_paths(case)  # still attends, on the torch path
        assert torch.isfinite(out).all()
    finally:
        build.load.cache_clear()
