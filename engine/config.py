"""Frozen configuration objects that cross module boundaries.

`ModelConfig` describes a Llama-family decoder (filled by the loaders from a Hugging Face
config.json or GGUF metadata). `EngineConfig` is what a user chooses; its "auto" fields are
settled for the machine it runs on when the engine is built (engine/engine_setup.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

RopeKind = Literal["default", "linear", "dynamic", "llama3", "yarn"]


def check_positive(config: object, names: tuple[str, ...]) -> None:
    """ValueError naming the first field of `names` that is not > 0."""
    for name in names:
        if getattr(config, name) <= 0:
            raise ValueError(f"{type(config).__name__}.{name} must be positive, got {getattr(config, name)}")


class AttentionHeads:
    """What ModelConfig and DrafterConfig derive alike from their attention heads (their own
    dataclass fields; this base declares them only for the methods below)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def check_head_groups(self) -> None:
        """ValueError unless the query heads split evenly into groups of one kv head each (GQA)."""
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{type(self).__name__}.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as real checkpoints declare it (`rope_scaling` in config.json)."""

    kind: RopeKind = "default"
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    def __post_init__(self) -> None:
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise ValueError(f"rope_scaling.factor must be a positive number, got {self.factor}")


@dataclass(frozen=True)
class ModelConfig(AttentionHeads):
    """Shape and behaviour of a Llama-family decoder (Llama 2/3, Mistral, SmolLM2, Qwen2/3)."""

    architecture: str  # registry key, e.g. "llama", "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rope_dim: int | None = None  # partial rotary; None = head_dim
    max_position: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    qk_norm: bool = False  # Qwen3 normalises q and k per head
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    weight_dtype: str = "float32"  # dtype the checkpoint was stored in (informational)

    def __post_init__(self) -> None:
        check_positive(
            self,
            (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "max_position",
            ),
        )
        self.check_head_groups()

    def replace(self, **changes: object) -> ModelConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


AttentionBackendName = Literal["auto", "torch", "triton"]
SchedulingPolicyName = Literal["mixed", "alternating"]
SchedulingChoice = Literal["auto", "mixed", "alternating"]


@dataclass(frozen=True)
class SpeculativeConfig:
    """DSpark speculative decoding. `drafter` is a checkpoint directory, or None for the
    drafter that ships with the model (engine.loader.resolve.shipped_drafter)."""

    method: Literal["dspark"] = "dspark"
    drafter: str | None = None
    gamma: int | None = None  # None: the drafter's own block size
    # Decode steps of more requests than this take one token per request without drafting
    # (a verify window costs more than it returns when the batch alone fills the device);
    # the drafter's KV still follows every committed token. None: always draft.
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.gamma is not None and not 1 <= self.gamma <= 32:
            raise ValueError(f"speculative gamma must be in [1, 32], got {self.gamma}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"speculative max_batch_size must be at least 1, got {self.max_batch_size}")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    tokenizer: str | None = None  # None: from the model
    # auto: bfloat16 on GPU; float32 on CPU, where a GGUF's quantized tensors stay quantized
    dtype: str = "auto"
    device: str = "auto"  # auto: cuda when available, else cpu
    seed: int = 0
    max_model_len: int | None = None  # None: the model's own context length
    max_num_seqs: int = 64  # requests decoded together
    max_num_batched_tokens: int = 2048  # per-step token budget (prefill chunk size)
    chunked_prefill: bool = True
    # "mixed": each step carries the decode rows and prefill chunks under one token budget;
    # "alternating": a step is prefill chunks or decode rows, taking turns (docs/design.md §2.3);
    # "auto": mixed on GPU, where its steps replay piecewise graphs and measure faster, and
    # alternating on CPU, where mixed steps do not (docs/benchmarks.md).
    scheduling: SchedulingChoice = "auto"
    enable_prefix_cache: bool = True
    page_size: int = 0  # 0: 1 on CPU, 16 on GPU
    kv_cache_memory_bytes: int = 0  # 0: derived from gpu_memory_utilization or kv_memory_fraction
    kv_memory_fraction: float = 0.6  # of free device memory after loading (GPU) or 1/8 of RAM (CPU)
    # GPU only: weights + KV pool take this share of the memory free when the engine starts
    # (engine/kv/budget.py); None: the KV pool takes kv_memory_fraction.
    gpu_memory_utilization: float | None = None
    chat_template: str | None = None  # Jinja text replacing the model's chat template
    attention_backend: AttentionBackendName = "auto"
    tensor_parallel_size: int = 1
    cuda_graphs: bool = True
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 16:
            raise ValueError(f"max_num_batched_tokens must be >= 16, got {self.max_num_batched_tokens}")
        if self.page_size < 0 or (self.page_size & (self.page_size - 1)) and self.page_size:
            raise ValueError(f"page_size must be 0 (auto) or a power of two, got {self.page_size}")
        if not 0.0 < self.kv_memory_fraction <= 0.95:
            raise ValueError(f"kv_memory_fraction must be in (0, 0.95], got {self.kv_memory_fraction}")
        if self.gpu_memory_utilization is not None:
            if not 0.0 < self.gpu_memory_utilization <= 1.0:
                raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
            if self.kv_cache_memory_bytes:
                raise ValueError("gpu_memory_utilization and kv_cache_memory_bytes both size the KV pool; set one")
        if self.scheduling not in ("auto", "mixed", "alternating"):
            raise ValueError(f"scheduling must be 'auto', 'mixed' or 'alternating', got {self.scheduling!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
