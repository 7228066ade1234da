"""RMSNorm, RoPE (every scaling kind) and SwiGLU against transformers' Llama code; the
parallel layers at TP=1 against plain linear algebra."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config import RopeScaling
from engine.distributed.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from engine.kernels import silu_and_mul
from engine.kernels.norm import rms_norm_torch
from engine.loader.hf import config_from_hf_dict
from engine.models.layers import RMSNorm, RotaryEmbedding, rope_inv_freq


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(5, 48).to(dtype) * 3
    ours, ref = RMSNorm(48, eps=1e-5), LlamaRMSNorm(48, eps=1e-5)
    weight = torch.rand(48) + 0.5
    ours.weight.data.copy_(weight)
    ref.weight.data.copy_(weight)
    ours, ref = ours.to(dtype), ref.to(dtype)
    y = ours(x)
    assert y.dtype == dtype
    expected = ref(x)
    # the reference formula is Hugging Face's, bit for bit; the C kernel that serves CPU rows
    # repeats its roundings but sums the squares in another order (tests/cpu_kernels)
    assert torch.equal(rms_norm_torch(x, ours.weight, 1e-5), expected)
    torch.testing.assert_close(y, expected, **({} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 1e-6}))


def test_silu_and_mul():
    x = torch.randn(3, 2, 16)
    assert torch.equal(silu_and_mul(x), F.silu(x[..., :8]) * x[..., 8:])


ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
    },
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rotary_matches_transformers(case):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hf_config = LlamaConfig(
        vocab_size=32,
        hidden_size=128,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=64,
        rope_theta=50000.0,
        rope_scaling=ROPE_CASES[case],
    )
    config = config_from_hf_dict(hf_config.to_dict())
    rope = RotaryEmbedding(
        config.head_dim, config.head_dim, config.max_position, config.rope_theta, config.rope_scaling
    )
    # The last cache position is included: dynamic NTK in transformers then uses the same base as our cache.
    positions = torch.tensor([0, 1, 2, 7, 31, 63, config.max_position - 1])
    q, k = torch.randn(len(positions), 2, 64), torch.randn(len(positions), 1, 64)
    q_ours, k_ours = rope(positions, q, k)

    hf_rope = LlamaRotaryEmbedding(hf_config)
    cos, sin = hf_rope(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    torch.testing.assert_close(q_ours, q_ref[0].transpose(0, 1), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(k_ours, k_ref[0].transpose(0, 1), atol=2e-6, rtol=1e-5)


def test_dynamic_ntk_base_is_computed_for_the_whole_cache():
    scaling = RopeScaling(kind="dynamic", factor=4.0, original_max_position=64)
    inv_freq, attention_factor = rope_inv_freq(32, 10000.0, scaling, max_position=256)
    base = 10000.0 * ((4.0 * 256 / 64) - 3.0) ** (32 / 30)
    expected = 1.0 / (base ** (torch.arange(0, 32, 2).float() / 32))
    torch.testing.assert_close(inv_freq, expected)
    assert attention_factor == 1.0


def test_partial_rotary_leaves_the_tail_untouched():
    full = RotaryEmbedding(16, 16, 32, 10000.0)
    partial = RotaryEmbedding(32, 16, 32, 10000.0)
    positions = torch.tensor([3, 9])
    q, k = torch.randn(2, 2, 32), torch.randn(2, 1, 32)
    q_partial, k_partial = partial(positions, q, k)
    q_full, k_full = full(positions, q[..., :16], k[..., :16])
    assert torch.equal(q_partial[..., :16], q_full) and torch.equal(k_partial[..., :16], k_full)
    assert torch.equal(q_partial[..., 16:], q[..., 16:]) and torch.equal(k_partial[..., 16:], k[..., 16:])


def test_rotary_keeps_half_precision_dtype():
    rope = RotaryEmbedding(8, 8, 16, 10000.0)
    q, k = rope(
        torch.tensor([1, 2]),
        torch.randn(2, 2, 8, dtype=torch.bfloat16),
        torch.randn(2, 1, 8, dtype=torch.bfloat16),
    )
    assert q.dtype == k.dtype == torch.bfloat16


def test_parallel_layers_at_tp1_are_plain_linear_algebra():
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    wq, wk, wv, bq = torch.randn(32, 16), torch.randn(8, 16), torch.randn(8, 16), torch.randn(32)
    qkv = QKVParallelLinear(16, head_dim=8, num_heads=4, num_kv_heads=1, bias=True)
    for name, weight in zip("qkv", (wq, wk, wv), strict=True):
        qkv.weight_loader(qkv.weight, weight, name)
    for name, bias in zip("qkv", (bq, torch.zeros(8), torch.zeros(8)), strict=True):
        qkv.weight_loader(qkv.bias, bias, name)
    torch.testing.assert_close(qkv(x), torch.cat([x @ wq.T + bq, x @ wk.T, x @ wv.T], dim=-1))

    gate, up = torch.randn(12, 16), torch.randn(12, 16)
    merged = MergedColumnParallelLinear(16, [12, 12])
    merged.weight_loader(merged.weight, gate, 0)
    merged.weight_loader(merged.weight, up, 1)
    torch.testing.assert_close(merged(x), torch.cat([x @ gate.T, x @ up.T], dim=-1))

    down, bias = torch.randn(5, 16), torch.randn(5)
    row = RowParallelLinear(16, 5, bias=True)
    row.weight_loader(row.weight, down)
    row.weight_loader(row.bias, bias)
    torch.testing.assert_close(row(x), x @ down.T + bias)

    table = torch.randn(10, 16)
    embedding, head = VocabParallelEmbedding(10, 16), ParallelLMHead(10, 16)
    embedding.weight_loader(embedding.weight, table)
    head.weight_loader(head.weight, table)
    ids = torch.tensor([0, 9, 4])
    assert torch.equal(embedding(ids), table[ids])
    torch.testing.assert_close(head(x), x @ table.T)

    with pytest.raises(ValueError, match="shape"):
        row.weight_loader(row.weight, torch.randn(5, 15))
