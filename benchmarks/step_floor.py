"""The device time an agentic step's token mix needs at the machine's measured rates: the floor
benchmarks/agentic_engine.py compares its steady steps with.

A step runs `decode_rows` one-token rows and `prefill_tokens` chunk tokens through the model.
Its work, per step:
- linear layers: 2 x (linear weights per layer x layers) FLOPs per token, plus the LM head for
  each row that samples (the decode rows, and one row per chunk at most: counted for every
  decode row only, which is the larger share);
- the weight stream: every linear weight once, hidden under the matmuls when they take longer;
- attention keys: the shared prefix once (cascade attention reads it once per step), each decode
  row's own keys, and each chunk's context once (its tokens attend it together);
- attention FLOPs: 4 x query heads x head dim per (query row, key) pair, every layer.

floor = max(linear FLOPs / matmul rate, weight bytes / copy rate) + KV bytes / copy rate
        + attention FLOPs / matmul rate

Two matmul rates give two floors: the device's peak (an 8k-square bf16 product) and the rate
of this model's own projections at the step's token count (`projection_rate`), the rate no
kernel choice can beat for those shapes with the library's GEMMs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from engine.config import ModelConfig


@dataclass(frozen=True)
class StepMix:
    """Means per step: the token mix over the run, the contexts over the profiled window."""

    decode_rows: float
    prefill_tokens: float
    decode_own_keys: float  # keys past the shared prefix each decode row reads
    chunks: float  # prefill chunks per step
    chunk_context: float  # keys before a chunk's first token (shared prefix included)
    shared_keys: int  # the prefix every request shares, read once per step


@dataclass(frozen=True)
class StepFloor:
    linear_ms: float
    weights_ms: float
    kv_ms: float
    attention_ms: float

    @property
    def total_ms(self) -> float:
        return max(self.linear_ms, self.weights_ms) + self.kv_ms + self.attention_ms


def linear_weights_per_layer(config: ModelConfig) -> int:
    q = config.num_heads * config.head_dim
    kv = 2 * config.num_kv_heads * config.head_dim
    return config.hidden_size * (q + kv) + q * config.hidden_size + 3 * config.hidden_size * config.intermediate_size


def step_floor(config: ModelConfig, mix: StepMix, copy_bytes_per_s: float, flops_per_s: float) -> StepFloor:
    element = 2  # bf16 weights and KV
    tokens = mix.decode_rows + mix.prefill_tokens
    layer_weights = linear_weights_per_layer(config) * config.num_layers
    head_weights = config.hidden_size * config.vocab_size
    linear_flops = 2 * (layer_weights * tokens + head_weights * mix.decode_rows)
    weight_bytes = element * (layer_weights + head_weights)
    kv_per_key = 2 * config.num_layers * config.num_kv_heads * config.head_dim * element
    chunk_keys = mix.chunks * mix.chunk_context + mix.prefill_tokens
    keys_read = mix.shared_keys + mix.decode_rows * mix.decode_own_keys + chunk_keys
    # query rows x keys they see: decode rows see everything, chunk tokens their context and half the chunk
    chunk_tokens_each = mix.prefill_tokens / max(mix.chunks, 1.0)
    pairs = mix.decode_rows * (mix.shared_keys + mix.decode_own_keys) + mix.prefill_tokens * (
        mix.chunk_context + chunk_tokens_each / 2
    )
    attention_flops = 4 * config.num_heads * config.head_dim * pairs * config.num_layers
    return StepFloor(
        linear_ms=1e3 * linear_flops / flops_per_s,
        weights_ms=1e3 * weight_bytes / copy_bytes_per_s,
        kv_ms=1e3 * keys_read * kv_per_key / copy_bytes_per_s,
        attention_ms=1e3 * attention_flops / flops_per_s,
    )


def projection_rate(config: ModelConfig, tokens: int, dtype: torch.dtype = torch.bfloat16, iters: int = 20) -> float:
    """FLOP/s of one layer's projections (qkv, o, gate+up, down) at `tokens` rows, on the GPU."""
    hidden, q = config.hidden_size, config.num_heads * config.head_dim
    shapes = [
        (hidden, q + 2 * config.num_kv_heads * config.head_dim),
        (q, hidden),
        (hidden, 2 * config.intermediate_size),
        (config.intermediate_size, hidden),
    ]
    inputs = [torch.randn(tokens, k, dtype=dtype, device="cuda") for k, _ in shapes]
    weights = [torch.randn(n, k, dtype=dtype, device="cuda") for k, n in shapes]

    def layer() -> None:
        for x, w in zip(inputs, weights, strict=True):
            torch.nn.functional.linear(x, w)

    for _ in range(3):
        layer()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        layer()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    flops = 2 * tokens * sum(k * n for k, n in shapes)
    return flops / statistics.median(times)
