"""The torch backend against a float64 per-request loop, on CPU: its torch path, and the
compiled C kernel it hands decode-sized forwards to (`cpu_kernel`; skipped where it cannot
be built)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_cases import (
    SCENARIOS,
    make_case,
    mixed_parts,
    reference_attention,
    scenario_case,
    stored_caches_float64,
    tolerance,
)

from engine.attention import TorchAttentionBackend, select_backend
from engine.kernels.cpu.attention import CpuPagedAttention
from engine.kernels.store_kv import store_kv, store_kv_torch
from engine.sync_guard import SyncGuard

GQA = [(4, 4), (6, 2), (8, 2)]  # (Hq, Hkv): group 1, 3, 4
CPU_KERNEL_BUILT = CpuPagedAttention().built
# with the C kernel: forwards of up to MAX_EXTEND rows per request take it, the others the torch path
PATHS = [
    pytest.param(False, id="torch-path"),
    pytest.param(True, id="cpu-kernel", marks=pytest.mark.skipif(not CPU_KERNEL_BUILT, reason="no C compiler")),
]


def run_torch(case, cpu_kernel: bool = False, **backend_kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k_cache, v_cache = case.clone_caches()
    out = torch.full_like(case.q, float("nan"))  # poison: every row must be written
    TorchAttentionBackend(cpu_kernel=cpu_kernel, **backend_kwargs).forward(
        case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale, out=out
    )
    return out, k_cache, v_cache


@pytest.mark.parametrize("cpu_kernel", PATHS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", GQA, ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_torch_backend_matches_float64_loop(
    scenario: str, heads: tuple[int, int], page_size: int, cpu_kernel: bool, seed: int
):
    case = scenario_case(scenario, seed, num_q_heads=heads[0], num_kv_heads=heads[1], page_size=page_size)
    out, k_cache, v_cache = run_torch(case, cpu_kernel=cpu_kernel)
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(torch.float32))
    k_ref, v_ref = stored_caches_float64(case)
    # every real slot equals the expected store (NaN where never written); the sink is free
    torch.testing.assert_close(k_cache[:-1].double(), k_ref[:-1], equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache[:-1].double(), v_ref[:-1], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("cpu_kernel", PATHS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("scenario", ["decode", "ragged-causal", "drafter"])
def test_torch_backend_real_head_dims(scenario: str, head_dim: int, cpu_kernel: bool, seed: int):
    case = scenario_case(scenario, seed, num_q_heads=8, num_kv_heads=2, head_dim=head_dim, page_size=16)
    out, _, _ = run_torch(case, cpu_kernel=cpu_kernel)
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("chunk_bytes", [1, 20_000])
@pytest.mark.parametrize("scenario", ["decode", "ragged-causal", "ragged-noncausal", "verify"])
def test_torch_backend_chunked_matches_unchunked(scenario: str, chunk_bytes: int, seed: int):
    """A tiny budget forces one request (and one query row) per chunk."""
    case = scenario_case(scenario, seed, num_q_heads=6, num_kv_heads=2, page_size=16)
    out_chunked, _, _ = run_torch(case, chunk_bytes=chunk_bytes)
    out_whole, _, _ = run_torch(case)
    torch.testing.assert_close(out_chunked, out_whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out_chunked.double(), reference_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("chunk_bytes", [30_000, 256 << 20])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_torch_backend_plans_once_per_forward(scenario: str, chunk_bytes: int, seed: int):
    """One backend through two forwards of two layers each: the plan the first layer makes
    serves the second bit for bit (with other cache contents), and the next forward's new
    metadata gets a plan of its own."""
    backend = TorchAttentionBackend(chunk_bytes=chunk_bytes, cpu_kernel=False)
    plans = []
    for case in (scenario_case(scenario, seed), scenario_case(scenario, seed + 1)):
        for scale in (1.0, -0.5):  # another layer: other keys and values
            layer_case = dataclasses.replace(case, k_cache=case.k_cache * scale, v_cache=case.v_cache * scale)
            k_cache, v_cache = layer_case.clone_caches()
            out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale)
            fresh, _, _ = run_torch(layer_case, chunk_bytes=chunk_bytes)
            torch.testing.assert_close(out, fresh, atol=0, rtol=0, equal_nan=True)
            plans.append(backend.plan_for(case.meta))
        torch.testing.assert_close(out.double(), reference_attention(layer_case), **tolerance(torch.float32))
    assert plans[0] is not None and plans[2] is not None
    assert plans[0] is plans[1] and plans[2] is plans[3] and plans[1] is not plans[2]


@pytest.mark.parametrize("cpu_kernel", PATHS)
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), GQA)
def test_a_mixed_forward_attends_its_parts_apart(cpu_kernel: bool, num_q_heads: int, num_kv_heads: int, seed: int):
    """A mixed forward's decode rows are attended apart from its chunks, never padded to a
    chunk's length (the C kernel takes them where it is built), each part with a plan of its
    own that the next layer reuses; together the parts give the reference's answer."""
    case = scenario_case("mixed", seed, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)
    meta = mixed_parts(case.meta, case.meta.batch_size - 2)  # the scenario ends with two chunks
    decode_rows, chunks = meta.parts
    backend = TorchAttentionBackend(cpu_kernel=cpu_kernel)
    plans = []
    for _ in range(2):  # two layers of one forward
        k_cache, v_cache = case.clone_caches()
        out = torch.full_like(case.q, float("nan"))
        backend.forward(case.q, case.k, case.v, k_cache, v_cache, meta, case.scale, out=out)
        torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(torch.float32))
        plans.append((backend.plan_for(decode_rows), backend.plan_for(chunks)))
    decode_plan, chunk_plan = plans[0]
    assert plans[1][0] is decode_plan and plans[1][1] is chunk_plan
    assert chunk_plan is not None and chunk_plan.rows_per_req == chunks.max_extend_len
    if cpu_kernel:
        assert decode_plan is None  # the C kernel's
    else:
        assert decode_plan is not None and decode_plan.rows_per_req == decode_rows.uniform_extend


@pytest.mark.parametrize("cpu_kernel", PATHS)
@pytest.mark.parametrize("scenario", ["ragged-causal", "verify"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_backend_low_precision(dtype: torch.dtype, scenario: str, cpu_kernel: bool, seed: int):
    case = scenario_case(scenario, seed, num_q_heads=8, num_kv_heads=2, head_dim=64, dtype=dtype)
    out, _, _ = run_torch(case, cpu_kernel=cpu_kernel)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(dtype))


@pytest.mark.parametrize("cpu_kernel", PATHS)
def test_torch_backend_tight_bounds_and_single_token(cpu_kernel: bool, seed: int):
    """Host bounds equal to the true maxima, and a batch of one one-token prompt."""
    case = make_case(seed, [7, 3], [0, 5], num_q_heads=4, num_kv_heads=1, bound_slack=0)
    out, _, _ = run_torch(case, cpu_kernel=cpu_kernel)
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(torch.float32))
    case = make_case(seed, [1], [0], num_q_heads=4, num_kv_heads=2, uniform=True, bound_slack=0)
    out, _, _ = run_torch(case, cpu_kernel=cpu_kernel)
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("cpu_kernel", PATHS)
def test_torch_backend_empty_request_rows_are_zero(cpu_kernel: bool, seed: int):
    """A padding request (seq_len 0, slot -1) in a uniform decode batch: its row is 0, the
    others are unaffected."""
    case = make_case(seed, [1, 1, 1], [4, 9, 2], num_q_heads=6, num_kv_heads=2, uniform=True)
    expected = reference_attention(case)
    meta = case.meta
    meta.seq_lens[1] = 0
    meta.out_slots[1] = -1
    out, _, _ = run_torch(case, cpu_kernel=cpu_kernel)
    assert torch.all(out[1] == 0)
    torch.testing.assert_close(out[[0, 2]].double(), expected[[0, 2]], **tolerance(torch.float32))


@pytest.mark.parametrize("cpu_kernel", PATHS)
def test_torch_backend_empty_forward(cpu_kernel: bool):
    case = make_case(0, [0, 0], [3, 0], uniform=False)
    out, _, _ = run_torch(case, cpu_kernel=cpu_kernel)
    assert out.shape == (0, 4, 32)


def test_store_kv_torch_writes_skips_into_the_sink(seed: int):
    case = scenario_case("ragged-causal", seed, page_size=16)
    k_cache, v_cache = case.clone_caches()
    store_kv_torch(case.k, case.v, k_cache, v_cache, case.meta.out_slots)
    k_ref, v_ref = stored_caches_float64(case)
    torch.testing.assert_close(k_cache[:-1].double(), k_ref[:-1], equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache[:-1].double(), v_ref[:-1], equal_nan=True, atol=0, rtol=0)
    k2, v2 = case.clone_caches()
    store_kv(case.k, case.v, k2, v2, case.meta.out_slots)  # CPU dispatch -> the torch path
    torch.testing.assert_close(k2, k_cache, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("cpu_kernel", PATHS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_torch_backend_is_sync_free(scenario: str, cpu_kernel: bool, seed: int):
    case = scenario_case(scenario, seed, num_q_heads=6, num_kv_heads=2, page_size=16)
    k_cache, v_cache = case.clone_caches()
    backend = TorchAttentionBackend(chunk_bytes=30_000, cpu_kernel=cpu_kernel)  # chunked loops too
    with SyncGuard("cpu"):
        out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale)
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(torch.float32))


def test_meta_shape_errors_are_precise():
    case = make_case(0, [2, 2], [1, 1], uniform=True)
    bad = dataclasses.replace(case.meta, num_tokens=3)
    with pytest.raises(ValueError, match="num_tokens"):
        k_cache, v_cache = case.clone_caches()
        TorchAttentionBackend().forward(case.q, case.k, case.v, k_cache, v_cache, bad, case.scale)


def test_select_backend():
    assert isinstance(select_backend("auto", "cpu"), TorchAttentionBackend)
    assert isinstance(select_backend("torch", torch.device("cpu")), TorchAttentionBackend)
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_backend("flash", "cpu")


def test_select_backend_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        select_backend("triton", "cpu")
