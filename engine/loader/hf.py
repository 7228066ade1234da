"""Hugging Face checkpoints: config.json → ModelConfig, and the safetensors tensors.

Reads both config layouts: transformers 5 (`rope_parameters` holding `rope_theta` and the
scaling) and transformers 4 (`rope_theta` beside `rope_scaling`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.config import ModelConfig, RopeScaling
from engine.loader.resolve import ModelNotFoundError

logger = logging.getLogger(__name__)

# config.json `model_type` -> registry key
_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def load_hf_config(model_dir: Path) -> ModelConfig:
    """ModelConfig from `model_dir/config.json` (+ `generation_config.json`'s EOS ids)."""
    config = _read_json(model_dir / "config.json")
    generation_path = model_dir / "generation_config.json"
    generation = _read_json(generation_path) if generation_path.is_file() else {}
    return config_from_hf_dict(config, generation)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open() as f:
            return json.load(f)
    except OSError as e:
        raise ModelNotFoundError(f"cannot read {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _token_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)  # type: ignore[attr-defined]


def config_from_hf_dict(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    model_type = str(cfg.get("model_type", ""))
    architecture = _ARCHITECTURES.get(model_type, model_type)
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if act != "silu":
        raise ValueError(f"config.json: hidden_act {act!r} is not supported (Llama-family models use 'silu')")
    if cfg.get("mlp_bias"):
        raise ValueError("config.json: mlp_bias=true is not supported")
    hidden_size = int(cfg["hidden_size"])
    num_heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden_size // num_heads)
    max_position_embeddings = int(cfg.get("max_position_embeddings", 4096))

    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    partial_rotary = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    rope_scaling, max_position = rope_scaling_from_hf(rope, max_position_embeddings)

    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window and int(window) < max_position:
        # Attention here has no sliding window; within the window it is exact, so stay there.
        logger.warning(
            "config.json declares a %d-token sliding window; max_position capped from %d to %d",
            window,
            max_position,
            window,
        )
        max_position = int(window)

    eos = _token_ids(cfg.get("eos_token_id")) + _token_ids((generation or {}).get("eos_token_id"))
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return ModelConfig(
        architecture=architecture,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden_size,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rope_dim=int(head_dim * partial_rotary) if partial_rotary != 1.0 else None,
        max_position=max_position,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases (its config has no flag for it).
        attention_bias=True if model_type == "qwen2" else bool(cfg.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        bos_token_id=cfg.get("bos_token_id") if isinstance(cfg.get("bos_token_id"), int) else None,
        eos_token_ids=tuple(dict.fromkeys(eos)),
        pad_token_id=cfg.get("pad_token_id") if isinstance(cfg.get("pad_token_id"), int) else None,
        weight_dtype=str(dtype),
    )


def rope_scaling_from_hf(rope: dict[str, Any], max_position_embeddings: int) -> tuple[RopeScaling | None, int]:
    """(RopeScaling or None, the context length the RoPE cache must cover).

    yarn and dynamic scaling extend the context to `original * factor`; linear and llama3
    checkpoints already state their extended length in `max_position_embeddings`.
    """
    kind = rope.get("rope_type", rope.get("type", "default")) or "default"
    if kind == "default":
        return None, max_position_embeddings
    if kind not in ("linear", "dynamic", "llama3", "yarn"):
        raise ValueError(f"rope scaling type {kind!r} is not supported (supported: linear, dynamic, llama3, yarn)")
    original = int(rope.get("original_max_position_embeddings") or max_position_embeddings)
    if rope.get("factor") is None and kind != "yarn":
        raise ValueError(f"rope_scaling: {kind} scaling needs a factor")
    factor = float(rope.get("factor") or max_position_embeddings / original)  # yarn may derive it
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor), max_position_embeddings
    if kind == "dynamic":
        scaling = RopeScaling(kind="dynamic", factor=factor, original_max_position=original)
        return scaling, max(max_position_embeddings, int(original * factor))
    if kind == "llama3":
        scaling = RopeScaling(
            kind="llama3",
            factor=factor,
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position=original,
        )
        return scaling, max_position_embeddings
    if rope.get("truncate", True) is False:
        raise ValueError("rope_scaling: yarn with truncate=false is not supported")
    scaling = RopeScaling(
        kind="yarn",
        factor=factor,
        original_max_position=original,
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        # transformers scales attention by mscale/mscale_all_dim only when both are set
        mscale=float(rope.get("mscale") or 0.0),
        mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0),
    )
    explicit = rope.get("attention_factor")
    if explicit is not None and not math.isclose(float(explicit), _yarn_attention_factor(scaling)):
        raise ValueError(
            f"rope_scaling: yarn attention_factor={explicit} differs from the one derived from "
            "factor/mscale; an explicit attention_factor is not supported"
        )
    return scaling, max(max_position_embeddings, int(original * factor))


def _yarn_attention_factor(scaling: RopeScaling) -> float:
    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return get_mscale(scaling.factor, scaling.mscale) / get_mscale(scaling.factor, scaling.mscale_all_dim)
    return get_mscale(scaling.factor)


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: those the index names, else every *.safetensors
    (Mistral's duplicate `consolidated.safetensors` is skipped when shards exist)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_json(index)["weight_map"].values()))
        files = [model_dir / name for name in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelNotFoundError(f"{index} names shard(s) missing from {model_dir}: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    shards = [f for f in files if not f.name.startswith("consolidated")]
    if not (shards or files):
        raise ModelNotFoundError(f"no *.safetensors files in {model_dir}")
    return shards or files


def count_safetensors(files: list[Path]) -> int:
    total = 0
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            total += len(list(f.keys()))
    return total


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor, read to CPU one at a time in its stored dtype."""
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                yield name, f.get_tensor(name)
