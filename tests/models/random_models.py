"""Small random-weight Hugging Face checkpoints of each supported family, and a greedy
reference from transformers itself.

Weights are redrawn with unit-variance activations in mind (transformers' 0.02 init gives
near-uniform logits whose argmax is a coin toss), so greedy tokens are decided by clear margins.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

_COMMON: dict[str, Any] = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)

FAMILIES: dict[str, dict[str, Any]] = {
    # SmolLM2-like: GQA, tied head
    "llama": dict(model_type="llama", tie_word_embeddings=True),
    # q/k norm, head_dim != hidden / heads, untied head
    "qwen3": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=False, rope_theta=10000.0),
    # q/k/v bias, tied head
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=10000.0),
    # Llama 3.1 RoPE scaling over a short original context, so most frequencies are rescaled
    "llama3": dict(
        model_type="llama",
        tie_word_embeddings=False,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    # YaRN: interpolation ramp and the mscale attention factor (~1.14 at factor 4)
    "yarn": dict(
        model_type="llama",
        tie_word_embeddings=True,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128),
    ),
    "linear": dict(model_type="llama", rope_scaling=dict(rope_type="linear", factor=2.0)),
    # explicit head_dim, no sliding window
    "mistral": dict(model_type="mistral", head_dim=32, sliding_window=None, tie_word_embeddings=False),
}


def hf_config(family: str, **overrides: Any) -> Any:
    from transformers import AutoConfig

    spec = {**_COMMON, **FAMILIES[family], **overrides}
    model_type = spec.pop("model_type")
    return AutoConfig.for_model(model_type, **spec)


@torch.no_grad()
def random_hf_model(family: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **overrides), dtype=torch.float32).eval()
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.uniform_(0.5, 1.5)
        elif name.endswith("bias"):
            param.normal_(0.0, 0.1)
        elif "embed_tokens" in name:
            param.normal_(0.0, 1.0)
        else:  # [out, in]: unit-variance outputs for unit-variance inputs
            param.normal_(0.0, 1.0 / math.sqrt(param.shape[1]))
    return model


def save_random_hf_model(
    directory: Path, family: str, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
) -> torch.nn.Module:
    model = random_hf_model(family, seed, **overrides)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return model


@torch.inference_mode()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and the raw logits [V] before each of them."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),  # never inferred from pad ids (SmolLM2's pad is <|im_end|>)
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out.sequences[0, len(prompt) :].tolist(), [step[0].float() for step in out.logits]
