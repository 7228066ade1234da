"""The fused KV-injection kernel against its torch reference (Triton interpreter on CPU,
tiny shapes; the real kernel when a GPU is present)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from spec_helpers import make_drafter, make_scenario, tiny_config

from engine.kernels.kv_inject import inject_layer_kv_torch, inject_layer_kv_triton, rope_neox
from engine.kernels.triton import kv_inject
from engine.models.layers import RotaryEmbedding

pytestmark = pytest.mark.skipif(kv_inject.triton is None, reason="triton is not installed")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def triton_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the kernel interpreted on CPU; recompile for each test's mode."""
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    kv_inject._compiled.cache_clear()
    yield
    kv_inject._compiled.cache_clear()


@pytest.mark.parametrize(
    ("tokens", "kv_heads", "head_dim", "half", "dtype"),
    [
        (5, 2, 16, 8, torch.float32),  # full rotary
        (4, 3, 12, 4, torch.float32),  # partial rotary, head_dim not a power of two
        (3, 1, 8, 2, torch.bfloat16),  # bf16 cache
    ],
)
def test_kernel_matches_reference(tokens: int, kv_heads: int, head_dim: int, half: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(tokens * 100 + head_dim)
    num_layers, num_slots = 3, 11
    width = 2 * kv_heads * head_dim
    stacked = torch.randn(tokens, num_layers * width, generator=gen).to(DEVICE, dtype)
    kv = stacked[:, width : 2 * width]  # layer 1's columns: a strided view, as in DSparkDrafter.inject_kv
    k_norm = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DEVICE, dtype)
    angles = torch.rand(tokens, half, generator=gen) * 6.28
    cos, sin = angles.cos().to(DEVICE), angles.sin().to(DEVICE)
    slots = torch.randperm(num_slots, generator=gen)[:tokens].to(DEVICE)
    slots[1] = -1
    caches = [torch.full((num_slots + 1, kv_heads, head_dim), 7.0, dtype=dtype, device=DEVICE) for _ in range(4)]
    inject_layer_kv_torch(kv, k_norm, 1e-6, cos, sin, slots, caches[0], caches[1])
    inject_layer_kv_triton(kv, k_norm, 1e-6, cos, sin, slots, caches[2], caches[3])
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(caches[2][:-1], caches[0][:-1], rtol=tol, atol=tol)  # includes rows nobody wrote
    torch.testing.assert_close(caches[3][:-1], caches[1][:-1], rtol=tol, atol=tol)
    assert (caches[2][-1] == 7).all() and (caches[3][-1] == 7).all()  # -1 is not written at all


def test_drafter_inject_triton_equals_torch() -> None:
    cfg = tiny_config(rope_dim=4)
    drafter, _ = make_drafter(cfg, seed=2)
    drafter.to(DEVICE)
    torch_scen = make_scenario(cfg, [4, 2], seed=3)
    triton_scen = make_scenario(cfg, [4, 2], seed=3)
    aux, positions, slots = torch_scen.flat_context()
    slots[2] = -1
    for scen, use_triton in ((torch_scen, False), (triton_scen, True)):
        scen.pool.k, scen.pool.v = scen.pool.k.to(DEVICE), scen.pool.v.to(DEVICE)
        drafter.inject_kv(aux.to(DEVICE), positions.to(DEVICE), slots.to(DEVICE), scen.pool, use_triton=use_triton)
    # NaN-poisoned rows that were never written must stay NaN in both: compare with equal_nan.
    torch.testing.assert_close(
        triton_scen.pool.k[:, :-1], torch_scen.pool.k[:, :-1], equal_nan=True, rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(triton_scen.pool.v[:, :-1], torch_scen.pool.v[:, :-1], equal_nan=True)


def test_rope_reference_matches_rotary_embedding() -> None:
    for rope_dim in (16, 6):
        rotary = RotaryEmbedding(16, rope_dim, 64, 500.0)
        positions = torch.tensor([0, 3, 63, 17])
        x = torch.randn(4, 3, 16)
        _, expected = rotary(positions, x[:, :0], x)
        cos, sin = rotary.cos_sin_cache[positions].chunk(2, dim=-1)
        torch.testing.assert_close(rope_neox(x, cos, sin), expected)
