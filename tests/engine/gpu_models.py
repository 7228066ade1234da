"""Small random models for GPU engine tests: nothing to download, nothing to carry."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.engine_setup import build_engine_parts
from engine.loader.load import load_model
from engine.runner.options import RunnerOptions
from tests.engine.conftest import random_drafter_dir, save_word_tokenizer


def random_llama_dir(out: Path, vocab_words: int = 509) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    save_word_tokenizer(out, [f"w{i}" for i in range(vocab_words)])
    config = LlamaConfig(
        vocab_size=vocab_words + 3,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(out))
    return out


def gpu_engine(
    tmp: Path,
    speculative: bool,
    drafter_layers: int = 1,
    max_batch_size: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    **options: object,
) -> EngineCore:
    model_dir, drafter_dir = gpu_model_dirs(tmp, speculative, drafter_layers)
    return gpu_engine_from(model_dir, drafter_dir, max_batch_size, dtype, **options)


def gpu_model_dirs(tmp: Path, speculative: bool, drafter_layers: int = 1) -> tuple[Path, Path | None]:
    """The random model (and drafter) saved under `tmp`, for engines in several processes."""
    model_dir = random_llama_dir(tmp / "model")
    if not speculative:
        return model_dir, None
    loaded = load_model(str(model_dir), dtype=torch.float32, device="cpu", progress=False)
    return model_dir, random_drafter_dir(tmp / "drafter", loaded, num_layers=drafter_layers)


def gpu_engine_from(
    model_dir: Path,
    drafter_dir: Path | None,
    max_batch_size: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    runner_options: RunnerOptions | None = None,
    **options: object,
) -> EngineCore:
    loaded = load_model(str(model_dir), dtype=dtype, device="cuda", progress=False)
    spec = None if drafter_dir is None else SpeculativeConfig(drafter=str(drafter_dir), max_batch_size=max_batch_size)
    options.setdefault("kv_cache_memory_bytes", 1 << 30)
    config = EngineConfig(
        model=str(model_dir),
        device="cuda",
        dtype=str(dtype).removeprefix("torch."),
        max_model_len=1024,
        max_num_seqs=8,
        speculative=spec,
        **options,
    )  # type: ignore[arg-type]
    return EngineCore(config, parts=build_engine_parts(config, loaded=loaded, runner_options=runner_options))
