"""The compiled kernels at real model shapes on a GPU (skipped without CUDA/ROCm), against
their torch references run on the same device, and captured in a CUDA graph.

`pytest tests/kernels` on the GPU machine runs these and, compiled, the small-shape tests.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, assert_rounded_like, randn

from engine.kernels import add_rms_norm, rms_norm, rotary_embedding, silu_and_mul
from engine.kernels.activation import silu_and_mul_torch
from engine.kernels.norm import add_rms_norm_torch, rms_norm_torch
from engine.kernels.rope import rotary_embedding_torch
from engine.kernels.triton.activation import silu_and_mul_triton
from engine.kernels.triton.norm import add_rms_norm_triton, rms_norm_triton
from engine.kernels.triton.rope import rotary_embedding_triton
from engine.models.layers import RotaryEmbedding

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]
EPS = 1e-5
BF16 = torch.bfloat16
TOKENS = [1, 8, 300]  # decode, a DSpark verify window, a prefill chunk


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", [4096, 576, 960])  # Llama-3-8B, SmolLM2-135M, SmolLM2-360M
def test_add_rms_norm(tokens: int, hidden: int, gen: torch.Generator) -> None:
    x = randn(gen, tokens, hidden, dtype=BF16)
    residual = randn(gen, tokens, hidden, dtype=BF16, scale=8.0)
    weight = randn(gen, hidden, dtype=BF16, scale=0.2) + 1
    y, residual_out = add_rms_norm_triton(x, residual, weight, EPS)
    y_ref, residual_ref = add_rms_norm_torch(x, residual, weight, EPS)
    assert_rounded_like(residual_out, residual_ref)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(rms_norm_triton(x, weight, EPS), rms_norm_torch(x, weight, EPS))


@pytest.mark.parametrize("tokens", TOKENS)
def test_qk_norm_of_qkv_views(tokens: int, gen: torch.Generator) -> None:
    q_heads, kv_heads, head_dim = 32, 8, 128  # Qwen3-8B
    qkv = randn(gen, tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=BF16)
    q = qkv[:, : q_heads * head_dim].unflatten(-1, (q_heads, head_dim))
    weight = randn(gen, head_dim, dtype=BF16, scale=0.2) + 1
    torch.testing.assert_close(rms_norm_triton(q, weight, EPS), rms_norm_torch(q, weight, EPS))


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "head_dim", "rope_dim"),
    [(32, 8, 128, 128), (9, 3, 64, 64), (32, 8, 128, 64)],  # Llama-3-8B, SmolLM2-135M, partial rotary
)
def test_rotary(tokens: int, q_heads: int, kv_heads: int, head_dim: int, rope_dim: int, gen: torch.Generator) -> None:
    qkv = randn(gen, tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=BF16)
    q, k, _ = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))
    cos_sin = RotaryEmbedding(head_dim, rope_dim, 8192, 500000.0).cos_sin_cache.to(DEVICE)
    positions = torch.randint(0, 8192, (tokens,), generator=gen).to(DEVICE)
    for got, expected in zip(
        rotary_embedding_triton(positions, q, k, cos_sin), rotary_embedding_torch(positions, q, k, cos_sin), strict=True
    ):
        assert_rounded_like(got, expected)


@pytest.mark.parametrize("tokens", TOKENS)
def test_silu_and_mul(tokens: int, gen: torch.Generator) -> None:
    x = randn(gen, tokens, 2 * 14336, dtype=BF16, scale=3.0)  # Llama-3-8B's gate_up output
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_torch(x))


def test_dispatch_picks_the_kernels_unless_autograd_records(gen: torch.Generator) -> None:
    x = randn(gen, 4, 64)
    weight = randn(gen, 64) + 1
    with torch.inference_mode():
        torch.testing.assert_close(rms_norm(x, weight, EPS), rms_norm_torch(x, weight, EPS))
    trained = weight.clone().requires_grad_(True)
    y = rms_norm(x, trained, EPS)  # the torch path: the kernels have no backward
    y.sum().backward()
    assert trained.grad is not None


def test_one_layer_of_kernels_replays_in_a_cuda_graph(gen: torch.Generator) -> None:
    """The four kernels of a decoder layer, captured once and replayed on new inputs."""
    hidden, heads, head_dim = 256, 4, 64
    x = randn(gen, 2, hidden, dtype=BF16)
    residual = randn(gen, 2, hidden, dtype=BF16)
    weight = randn(gen, hidden, dtype=BF16) + 1
    qk = randn(gen, 2, 2 * heads, head_dim, dtype=BF16)
    gate_up = randn(gen, 2, 512, dtype=BF16)
    positions = torch.tensor([3, 7], device=DEVICE)
    cos_sin = RotaryEmbedding(head_dim, head_dim, 64, 10000.0).cos_sin_cache.to(DEVICE)

    def layer() -> tuple[torch.Tensor, ...]:
        y, res = add_rms_norm(x, residual, weight, EPS)
        q, k = rotary_embedding(positions, qk[:, :heads], qk[:, heads:], cos_sin)
        return y, res, q, k, silu_and_mul(gate_up)

    with torch.inference_mode():
        layer()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = layer()
        for tensor in (x, residual, qk, gate_up):
            tensor.copy_(torch.randn(tensor.shape, generator=gen).to(DEVICE, BF16))
        positions.copy_(torch.tensor([60, 0], device=DEVICE))
        graph.replay()
        expected = layer()
    for got, want in zip(outputs, expected, strict=True):
        assert torch.equal(got, want)
