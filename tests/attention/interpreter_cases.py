"""The Triton attention kernels (engine/kernels/triton/{decode,extend}_attention.py) and the
Triton backend under TRITON_INTERPRET=1 on CPU, against the torch backend and a float64
per-request loop (the KV-store kernel alone: tests/kernels/triton/test_store_kv.py). Shapes
are tiny (the interpreter runs each program in Python); tiles of 16 make every request span
several key blocks, query blocks and splits.

Not collected by a plain `pytest` run (the name lacks `test_`): test_attention_triton.py
runs this file in a subprocess with TRITON_INTERPRET=1, because the variable must be set
before triton itself is first imported (tests/triton_interpreter.py). Run it directly with
`TRITON_INTERPRET=1 python -m pytest tests/attention/interpreter_cases.py`.
"""

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

from tests.triton_interpreter import require_interpreter

require_interpreter()

import engine.attention.triton_backend as triton_backend  # noqa: E402
import engine.kernels.store_kv as store_kv_module  # noqa: E402
import engine.kernels.triton.decode_attention as triton_decode  # noqa: E402
import engine.kernels.triton.extend_attention as triton_extend  # noqa: E402
import engine.kernels.triton.shared_prefix_attention as triton_shared  # noqa: E402
from engine.attention import TorchAttentionBackend, select_backend  # noqa: E402
from engine.kernels.triton.decode_attention import MAX_ROWS  # noqa: E402

GQA = {1: (2, 2), 3: (6, 2), 4: (4, 1)}  # group -> (Hq, Hkv)


def stored(case):
    """Caches after the torch store (the kernels only read them)."""
    k_cache, v_cache = case.clone_caches()
    store_kv_module.store_kv_torch(case.k, case.v, k_cache, v_cache, case.meta.out_slots)
    return k_cache, v_cache


def check(case, out: torch.Tensor) -> None:
    assert not out.isnan().any(), "a row was not written (or read a poisoned key)"
    torch.testing.assert_close(out.double(), reference_attention(case), **tolerance(case.q.dtype))
    k_cache, v_cache = stored(case)
    torch_out = TorchAttentionBackend().forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale)
    torch.testing.assert_close(out, torch_out, **tolerance(case.q.dtype))


def poisoned(case) -> torch.Tensor:
    return torch.full_like(case.q, float("nan"))


@pytest.mark.parametrize(
    ("scenario", "group", "page_size", "num_splits"),
    [
        ("decode", 1, 1, None),
        ("decode", 3, 16, 3),
        ("decode", 4, 1, 1),
        ("verify", 4, 16, 2),
        ("verify", 1, 1, 1),
        ("drafter", 3, 1, 3),
        ("drafter", 4, 16, 1),
        ("ragged-causal", 3, 16, 2),
        ("ragged-noncausal", 1, 1, 1),
    ],
)
def test_split_kv_kernel(scenario: str, group: int, page_size: int, num_splits: int | None, seed: int):
    hq, hkv = GQA[group]
    max_len = 12 if scenario.startswith("ragged") else 32  # every request's rows in one tile
    case = scenario_case(scenario, seed, num_q_heads=hq, num_kv_heads=hkv, page_size=page_size, max_len=max_len)
    assert triton_decode.split_kv_rows(case.meta, group) <= triton_decode.MAX_ROWS
    k_cache, v_cache = stored(case)
    out = poisoned(case)
    triton_decode.decode_attention(
        case.q, k_cache, v_cache, case.meta, case.scale, out, num_splits=num_splits, block_n=16
    )
    check(case, out)


@pytest.mark.parametrize(
    ("scenario", "group", "page_size"),
    [
        ("ragged-causal", 1, 1),
        ("ragged-causal", 3, 16),
        ("ragged-causal", 4, 16),
        ("ragged-noncausal", 3, 1),
        ("ragged-noncausal", 4, 16),
        ("mixed", 3, 16),
        ("mixed", 4, 1),
        ("verify", 3, 16),
        ("drafter", 4, 1),
        ("decode", 3, 16),
    ],
)
def test_extend_kernel(scenario: str, group: int, page_size: int, seed: int):
    hq, hkv = GQA[group]
    case = scenario_case(scenario, seed, num_q_heads=hq, num_kv_heads=hkv, page_size=page_size)
    k_cache, v_cache = stored(case)
    out = poisoned(case)
    triton_extend.extend_attention(case.q, k_cache, v_cache, case.meta, case.scale, out, block_m=16, block_n=16)
    check(case, out)


@pytest.mark.parametrize("head_dim", [64, 128, 48])  # 48: a padded (non power of two) tile
def test_kernels_real_head_dims(head_dim: int, seed: int):
    case = make_case(seed, [9, 1, 4], [0, 20, 6], num_q_heads=4, num_kv_heads=1, head_dim=head_dim, page_size=16)
    k_cache, v_cache = stored(case)
    out = poisoned(case)
    triton_extend.extend_attention(case.q, k_cache, v_cache, case.meta, case.scale, out, block_m=16, block_n=16)
    check(case, out)
    decode = make_case(seed + 1, [1, 1], [30, 3], num_q_heads=4, num_kv_heads=1, head_dim=head_dim, uniform=True)
    k_cache, v_cache = stored(decode)
    out = poisoned(decode)
    triton_decode.decode_attention(decode.q, k_cache, v_cache, decode.meta, decode.scale, out, num_splits=2)
    check(decode, out)


@pytest.mark.parametrize("scenario", ["decode", "verify", "ragged-causal", "drafter", "mixed"])
def test_triton_backend_forward(scenario: str, seed: int):
    """Store + kernel choice as the model calls it (half-precision, default tiles)."""
    case = scenario_case(scenario, seed, num_q_heads=6, num_kv_heads=2, page_size=16, dtype=torch.float16)
    backend = select_backend("triton", "cpu")
    assert isinstance(backend, triton_backend.TritonAttentionBackend)
    k_cache, v_cache = case.clone_caches()
    out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.meta, case.scale, out=poisoned(case))
    check(case, out)
    k_ref, _ = stored_caches_float64(case)
    torch.testing.assert_close(k_cache[:-1].double(), k_ref[:-1], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("group", [1, 3])
def test_a_mixed_forward_attends_its_parts_with_their_own_kernels(group: int, seed: int, monkeypatch):
    """The decode rows of a mixed forward go through the split-KV kernel, whatever the chunks'
    length (the chunks take the kernel their own rows call for), and together they give the
    one-forward answer."""
    num_q_heads, num_kv_heads = GQA[group]
    case = scenario_case("mixed", seed, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, page_size=16)
    meta = mixed_parts(case.meta, case.meta.batch_size - 2)  # the scenario ends with two chunks
    calls: list[tuple[str, int]] = []
    for module, name in ((triton_backend, "decode_attention_launches"), (triton_backend, "extend_attention_launches")):
        kernel = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda q, *a, _k=kernel, _n=name, **kw: (calls.append((_n, q.shape[0])), _k(q, *a, **kw))[1]
        )
    k_cache, v_cache = case.clone_caches()
    backend = triton_backend.TritonAttentionBackend()
    out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, meta, case.scale, out=poisoned(case))
    check(case, out)
    decode_rows, chunks = meta.parts
    n = decode_rows.num_tokens
    chunk_kernel = "decode_attention" if triton_decode.split_kv_rows(chunks, group) <= MAX_ROWS else "extend_attention"
    assert calls == [("decode_attention_launches", n), (f"{chunk_kernel}_launches", case.meta.num_tokens - n)]


# (extend lens, prefix lens, causal, uniform, sharing): requests whose first 32 keys lie in
# the same pages, and some that do not share them (their own pages, or too short a prefix).
CASCADE_CASES = {
    "decode": ([1] * 5, [40, 33, 32, 50, 7], True, True, [True, True, True, False, False]),
    "verify": ([4] * 4, [35, 60, 32, 44], True, True, None),
    "drafter": ([3] * 3, [32, 47, 40], False, True, None),
    "prefill": ([20, 37, 1, 5], [32, 40, 0, 70], True, False, None),
    "nothing-shared": ([1] * 3, [40, 50, 33], True, True, [False, False, False]),
    "long-own-keys": ([1] * 2, [300, 290], True, True, None),  # own keys over several splits, then a merge
}


@pytest.mark.parametrize("name", sorted(CASCADE_CASES))
@pytest.mark.parametrize(("group", "page_size"), [(3, 16), (4, 1)])
def test_shared_prefix_attention(name: str, group: int, page_size: int, seed: int):
    """The shared keys once for all sharing rows, the rest per request, merged: the reference's
    answer for every forward kind, whichever kernel attends the own keys."""
    extend, prefix, causal, uniform, sharing = CASCADE_CASES[name]
    hq, hkv = GQA[group]
    case = make_case(
        seed, extend, prefix, num_q_heads=hq, num_kv_heads=hkv, page_size=page_size, causal=causal,
        uniform=uniform, shared_len=32, sharing=sharing,
    )  # fmt: skip
    if name == "long-own-keys":
        assert triton_shared._own_splits(case.meta, group, hkv, torch.device("cpu")) > 1
    k_cache, v_cache = stored(case)
    out = triton_shared.cascade_attention(case.q, k_cache, v_cache, case.meta, case.scale, poisoned(case))
    check(case, out)


@pytest.mark.parametrize("group", [1, 3])
def test_a_mixed_forward_reads_its_shared_prefix_once(group: int, seed: int):
    """A mixed forward's decode windows and chunks share one shared pass, then each part's own
    kernel; through the backend as the model calls it."""
    hq, hkv = GQA[group]
    case = make_case(
        seed, [4, 4, 4, 30, 9], [40, 33, 48, 32, 64], num_q_heads=hq, num_kv_heads=hkv, page_size=16, shared_len=32,
    )  # fmt: skip
    meta = mixed_parts(case.meta, 3)
    k_cache, v_cache = case.clone_caches()
    out = triton_backend.TritonAttentionBackend().forward(
        case.q, case.k, case.v, k_cache, v_cache, meta, case.scale, out=poisoned(case)
    )
    check(case, out)


def _other_values(case, seed: int):
    """The same forward (metadata, slots) with other queries, keys and cached values: another layer."""
    generator = torch.Generator().manual_seed(seed)

    def like(t: torch.Tensor) -> torch.Tensor:
        fresh = torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.dtype)
        return torch.where(t.isnan(), t, fresh)  # unused cache rows stay poisoned

    return dataclasses.replace(
        case, q=like(case.q), k=like(case.k), v=like(case.v), k_cache=like(case.k_cache), v_cache=like(case.v_cache)
    )


@pytest.mark.parametrize("shared_len", [0, 32])
def test_a_forward_prepares_its_launches_once_for_all_its_layers(shared_len: int, seed: int, monkeypatch):
    """Layers that pass the same q/k/v/out buffers and metadata (the eager attention between
    piecewise graphs) reuse the launches the first layer prepared, each with its own caches
    and values: every layer gets its own reference's answer; new metadata prepares anew."""
    hq, hkv = GQA[3]
    first = make_case(
        seed, [4, 4, 4, 30, 9], [40, 33, 48, 32, 64], num_q_heads=hq, num_kv_heads=hkv, page_size=16,
        shared_len=shared_len,
    )  # fmt: skip
    layers = [first, _other_values(first, seed + 1)]
    prepared: list[int] = []
    prepare = triton_backend._prepare
    monkeypatch.setattr(triton_backend, "_prepare", lambda *a: (prepared.append(1), prepare(*a))[1])
    q, k, v = (first.q.clone(), first.k.contiguous(), first.v.contiguous())
    out = poisoned(first)
    backend = triton_backend.TritonAttentionBackend()
    for meta in (mixed_parts(first.meta, 3), mixed_parts(first.meta, 3)):
        for layer in layers:
            for buffer, value in ((q, layer.q), (k, layer.k), (v, layer.v)):
                buffer.copy_(value)
            k_cache, v_cache = layer.clone_caches()
            out.fill_(float("nan"))
            backend.forward(q, k, v, k_cache, v_cache, meta, layer.scale, out=out)
            check(dataclasses.replace(layer, meta=meta), out)
    assert len(prepared) == 2  # once per metadata object


def test_empty_request_rows_are_zero(seed: int):
    """A padding request (seq_len 0) of a uniform decode batch gets a zero row from both
    kernels, as from the torch backend; split merging must not produce NaN."""
    case = make_case(seed, [1, 1, 1], [4, 9, 2], num_q_heads=6, num_kv_heads=2, uniform=True)
    expected = reference_attention(case)
    case.meta.seq_lens[1] = 0
    case.meta.out_slots[1] = -1
    k_cache, v_cache = stored(case)
    for run in (
        lambda out: triton_decode.decode_attention(case.q, k_cache, v_cache, case.meta, case.scale, out, num_splits=1),
        lambda out: triton_decode.decode_attention(case.q, k_cache, v_cache, case.meta, case.scale, out, num_splits=2),
        lambda out: triton_extend.extend_attention(case.q, k_cache, v_cache, case.meta, case.scale, out),
    ):
        out = run(poisoned(case))
        assert torch.all(out[1] == 0)
        torch.testing.assert_close(out[[0, 2]].double(), expected[[0, 2]], **tolerance(torch.float32))


def test_num_kv_splits_uses_host_bounds_only():
    cpu = torch.device("cpu")
    assert triton_decode.num_kv_splits(256, 8, 4096, cpu) == 1
    assert triton_decode.num_kv_splits(1, 1, 100, cpu) == 1  # shorter than one split
    assert 1 < triton_decode.num_kv_splits(1, 1, 4096, cpu) <= triton_decode.MAX_SPLITS


def test_scenarios_cover_every_kind():
    assert set(SCENARIOS) == {"decode", "verify", "drafter", "ragged-causal", "ragged-noncausal", "mixed"}
