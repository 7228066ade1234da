"""Compiled Triton kernels on a real GPU at model shapes (skipped without CUDA/ROCm).

`pytest -m gpu tests/attention` on the GPU machine. Each kernel is checked against the torch
backend run in float32 on the same inputs, small cases also against the float64 loop, and
the decode path is captured in a CUDA graph and replayed with new lengths.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_cases import make_case, reference_attention, scenario_case, stored_caches_float64, tolerance

from engine.attention import TorchAttentionBackend, select_backend
from engine.sync_guard import SyncGuard

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]

# (Hq, Hkv, D): Llama-3-8B, SmolLM2-135M, Qwen3-style 128/4 and a D=256 model
STATIC = (
    "req_to_token",
    "req_rows",
    "seq_lens",
    "extend_lens",
    "q_start",
    "out_slots",
    "token_req",
    "token_offset",
)
MODELS = {"llama3-8b": (32, 8, 128), "smollm2": (9, 3, 64), "gqa8": (32, 4, 128), "d256": (8, 4, 256)}


def triton_vs_torch(case, **tol) -> torch.Tensor:
    backend = select_backend("auto", case.q.device)
    assert backend.name == "triton"
    k_cache, v_cache = case.clone_caches()
    out = torch.full_like(case.q, float("nan"))
    backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale, out=out)
    assert not out.isnan().any()
    k_ref, v_ref = case.clone_caches()
    ref = TorchAttentionBackend().forward(
        case.q.float(), case.k.float(), case.v.float(), k_ref.float(), v_ref.float(), case.meta, case.scale
    )
    torch.testing.assert_close(out.float(), ref, **(tol or tolerance(case.q.dtype)))
    return out


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(
    ("extend", "prefix", "uniform", "causal"),
    [
        ([1] * 16, [1023, 17, 512, 4000, 0, 999, 64, 100, 1, 2047, 300, 301, 302, 5, 800, 1500], True, True),
        ([1] * 2, [4095, 30], True, True),  # few requests, long context: many splits
        ([8] * 12, [1000 + 37 * i for i in range(12)], True, True),  # DSpark verify, W = 8
        ([7] * 12, [1000 + 37 * i for i in range(12)], True, False),  # drafter block, gamma = 7
        ([2048, 300, 1, 1, 0, 64], [0, 700, 1000, 50, 20, 0], False, True),  # ragged prefill/extend
        ([1500, 16, 200], [0, 2000, 33], False, False),
    ],
    ids=["decode16", "decode2-long", "verify", "drafter", "ragged", "ragged-noncausal"],
)
def test_triton_matches_torch_at_model_shapes(model, extend, prefix, uniform, causal):
    hq, hkv, d = MODELS[model]
    case = make_case(
        len(extend) * 7 + d, extend, prefix, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=16,
        causal=causal, dtype=torch.bfloat16, device="cuda", uniform=uniform,
    )  # fmt: skip
    triton_vs_torch(case)


@pytest.mark.parametrize("model", ["llama3-8b", "smollm2", "d256"])
@pytest.mark.parametrize(
    ("extend", "prefix", "uniform", "causal", "shared_len"),
    [
        ([1] * 40, [2048 + 13 * i for i in range(40)], True, True, 2048),  # agentic decode rows
        ([8] * 12, [1024 + 37 * i for i in range(12)], True, True, 896),  # DSpark verify windows
        ([7] * 12, [1024 + 37 * i for i in range(12)], True, False, 1024),  # drafter blocks
        ([1] * 30 + [200, 64, 300], [2100 + 7 * i for i in range(30)] + [2048, 2300, 2048], False, True, 2048),
    ],
    ids=["decode40", "verify", "drafter", "mixed-rows"],
)
def test_shared_prefix_pass_matches_torch_at_model_shapes(model, extend, prefix, uniform, causal, shared_len):
    """The cascade (docs/design.md §4.9) with the GPU's own tiles, every row sharing."""
    hq, hkv, d = MODELS[model]
    case = make_case(
        len(extend) + d, extend, prefix, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=16,
        causal=causal, dtype=torch.bfloat16, device="cuda", uniform=uniform, shared_len=shared_len,
    )  # fmt: skip
    assert case.meta.shared is not None and int(case.meta.shared.lens.min()) == shared_len
    triton_vs_torch(case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scenario", ["decode", "verify", "drafter", "ragged-causal", "ragged-noncausal"])
def test_triton_matches_float64_loop(scenario, dtype, seed):
    case = scenario_case(scenario, seed, num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=16,
                         dtype=dtype, device="cuda", max_len=300)  # fmt: skip
    out = triton_vs_torch(case)
    torch.testing.assert_close(out.double().cpu(), reference_attention(case), **tolerance(dtype))


def test_store_kv_kernel_at_model_shapes(seed):
    case = scenario_case("ragged-causal", seed, num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
                         dtype=torch.bfloat16, device="cuda", max_len=500)  # fmt: skip
    from engine.kernels.triton.store_kv import store_kv_triton

    k_cache, v_cache = case.clone_caches()
    store_kv_triton(case.k, case.v, k_cache, v_cache, case.meta.out_slots)
    k_ref, v_ref = stored_caches_float64(case)
    torch.testing.assert_close(k_cache[:-1].double().cpu(), k_ref[:-1], equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache[:-1].double().cpu(), v_ref[:-1], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("backend_name", ["triton", "torch"])
def test_forward_is_sync_free(backend_name):
    backend = select_backend(backend_name, "cuda")
    for case in (
        make_case(1, [1] * 8, [100 * i for i in range(8)], num_q_heads=32, num_kv_heads=8, head_dim=128,
                  dtype=torch.bfloat16, device="cuda", uniform=True),
        make_case(2, [300, 1, 0, 40], [0, 90, 5, 400], num_q_heads=32, num_kv_heads=8, head_dim=128,
                  dtype=torch.bfloat16, device="cuda"),
    ):  # fmt: skip
        k_cache, v_cache = case.clone_caches()
        torch.cuda.synchronize()
        with SyncGuard("cuda"):
            backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale)
        torch.cuda.synchronize()


@pytest.mark.parametrize("window", [1, 8, 24])  # decode, verify (split-KV kernel), extend kernel
def test_decode_and_verify_replay_in_a_cuda_graph(window):
    """Capture once, then replay with other lengths, tables and slots copied in place."""
    batch, hq, hkv, d = 8, 32, 8, 128
    prefixes = [500 + 40 * i for i in range(batch)]
    first = make_case(3, [window] * batch, prefixes, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                      dtype=torch.bfloat16, device="cuda", uniform=True)  # fmt: skip
    second = make_case(4, [window] * batch, prefixes[::-1], num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                       dtype=torch.bfloat16, device="cuda", uniform=True)  # fmt: skip
    # one set of static buffers, sized for both; bounds fixed at capture
    num_rows = max(first.k_cache.shape[0], second.k_cache.shape[0])
    k_cache = torch.zeros(num_rows, hkv, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    # static metadata: same host bounds and table shape as both cases
    meta = dataclasses.replace(first.meta, **{name: getattr(first.meta, name).clone() for name in STATIC})
    q, k, v = first.q.clone(), first.k.clone(), first.v.clone()
    out = torch.empty_like(q)
    backend = select_backend("triton", "cuda")

    def load(case):
        k_cache[: case.k_cache.shape[0] - 1].copy_(case.k_cache[:-1].nan_to_num(0.0))
        v_cache[: case.v_cache.shape[0] - 1].copy_(case.v_cache[:-1].nan_to_num(0.0))
        for name in STATIC:
            getattr(meta, name).copy_(getattr(case.meta, name))
        q.copy_(case.q)
        k.copy_(case.k)
        v.copy_(case.v)

    load(first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(q, k, v, k_cache, v_cache, meta, first.scale, out=out)  # warm-up compiles
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.forward(q, k, v, k_cache, v_cache, meta, first.scale, out=out)

    for case in (second, first):
        load(case)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.double().cpu(), reference_attention(case), **tolerance(torch.bfloat16))
