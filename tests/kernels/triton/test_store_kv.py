"""The KV-store kernel against its torch reference: interpreted on CPU, compiled on a GPU."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, randn

from engine.kernels.store_kv import store_kv_torch
from engine.kernels.triton.launch import LayerLaunch
from engine.kernels.triton.store_kv import _compiled, store_kv_launches, store_kv_triton

NUM_SLOTS = 40


def fused_kv(
    gen: torch.Generator, tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [T, Hkv, D] as the attention layer gets them: strided column views of one fused qkv
    output (a q head in front)."""
    qkv = randn(gen, tokens, (1 + 2 * kv_heads) * head_dim, dtype=dtype)
    _, k, v = qkv.split([head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return k.unflatten(-1, (kv_heads, head_dim)), v.unflatten(-1, (kv_heads, head_dim))


@pytest.mark.parametrize(
    ("kv_dtype", "cache_dtype"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)],
)
@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim"), [(7, 2, 16), (5, 3, 24), (1, 1, 8)])
def test_store_kv_matches_reference(
    kv_dtype: torch.dtype, cache_dtype: torch.dtype, tokens: int, kv_heads: int, head_dim: int, gen: torch.Generator
) -> None:
    k, v = fused_kv(gen, tokens, kv_heads, head_dim, kv_dtype)
    slots = torch.randperm(NUM_SLOTS, generator=gen)[:tokens]
    slots[torch.rand(tokens, generator=gen) < 0.3] = -1  # skipped tokens
    slots = slots.to(DEVICE)
    empty = torch.full((NUM_SLOTS + 1, kv_heads, head_dim), float("nan"), dtype=cache_dtype, device=DEVICE)
    k_ref, v_ref, k_cache, v_cache = (empty.clone() for _ in range(4))
    store_kv_torch(k, v, k_ref, v_ref, slots)
    store_kv_triton(k, v, k_cache, v_cache, slots)
    for got, expected in ((k_cache, k_ref), (v_cache, v_ref)):
        # a copy with one conversion: bit-equal, rows nobody wrote still NaN
        torch.testing.assert_close(got[:-1], expected[:-1], equal_nan=True, rtol=0, atol=0)
        assert got[-1].isnan().all(), "slot -1 must not be written"


def test_strided_cache_is_rejected(gen: torch.Generator) -> None:
    k, v = fused_kv(gen, 2, 1, 8, torch.float32)
    cache = torch.zeros(NUM_SLOTS + 1, 1, 16, device=DEVICE)[..., ::2]  # [slots, 1, 8], dim stride 2
    with pytest.raises(ValueError, match="contiguous last dim"):
        store_kv_triton(k, v, cache, cache, torch.zeros(2, dtype=torch.int64, device=DEVICE))


def test_one_prepared_launch_serves_every_layer(gen: torch.Generator) -> None:
    """A forward prepares the store once and calls it per layer with that layer's caches, its
    k/v buffers refilled in between (piecewise graphs' static buffers): compiled, the calls
    after the first skip Triton's JIT and must still write each layer's own cache."""
    layers, tokens, kv_heads, head_dim = 3, 6, 2, 16
    k, v = fused_kv(gen, tokens, kv_heads, head_dim, torch.float32)
    slots = torch.randperm(NUM_SLOTS, generator=gen)[:tokens].to(DEVICE)
    pool = torch.full((2, layers, NUM_SLOTS + 1, kv_heads, head_dim), float("nan"), device=DEVICE)
    reference = pool.clone()
    (launch,) = store_kv_launches(k, v, slots)
    for layer in range(layers):
        k.copy_(randn(gen, *k.shape))
        v.copy_(randn(gen, *v.shape))
        launch(pool[0, layer], pool[1, layer])
        store_kv_torch(k, v, reference[0, layer], reference[1, layer], slots)
    torch.testing.assert_close(pool, reference, equal_nan=True, rtol=0, atol=0)


def test_layer_launch_goes_direct_once_compiled(gen: torch.Generator) -> None:
    k, v = fused_kv(gen, 4, 1, 8, torch.float32)
    cache = torch.zeros(NUM_SLOTS + 1, 1, 8, device=DEVICE)
    slots = torch.arange(4, device=DEVICE)
    launch = LayerLaunch(_compiled(), (4,))
    args = (k, v, cache, cache, slots, *k.stride()[:2], *v.stride()[:2], *cache.stride()[:2], *cache.stride()[:2])
    for _ in range(2):
        launch(*args, NUM_KV_HEADS=1, HEAD_DIM=8, BLOCK_HD=8)
    assert launch.direct == (DEVICE.type == "cuda")
    torch.testing.assert_close(cache[:4], v.float(), rtol=0, atol=0)
