"""`gpu_memory_utilization` on a real GPU: an engine built with share u takes u of the memory
that was free when it started (weights + KV pool, engine/kv/budget.py), measured from outside
with `torch.cuda.mem_get_info`, whatever the card's size."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.sampling_params import SamplingParams
from tests.engine.conftest import save_word_tokenizer

GIB = 1 << 30
# Beyond weights + KV, an engine holds its CUDA context share, workspaces and graph pools.
OVERHEAD_ALLOWED_BYTES = 2 * GIB
# The pool rounds down to whole pages and the allocator to its blocks.
UNDERSHOOT_ALLOWED_BYTES = 1 * GIB

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]


def _model_dir(out: Path) -> Path:
    """A random Llama whose KV slot is 64 KiB (16 layers x 8 KV heads x 128 x K and V x bf16)
    and whose context is long, so the memory share, not max_num_seqs x context, sizes the pool."""
    from transformers import LlamaConfig, LlamaForCausalLM

    words = [f"w{i}" for i in range(509)]
    save_word_tokenizer(out, words)
    config = LlamaConfig(
        vocab_size=len(words) + 3,
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(str(out))
    return out


def _free_bytes() -> int:
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def _memory_taken(model_dir: Path, utilization: float) -> tuple[int, int]:
    """(free bytes before the engine, bytes the engine holds after serving a few requests)."""
    free_at_start = _free_bytes()
    config = EngineConfig(
        model=str(model_dir),
        device="cuda",
        dtype="bfloat16",
        gpu_memory_utilization=utilization,
        max_model_len=8192,
        max_num_seqs=256,
    )
    engine = EngineCore(config)
    for i in range(4):
        engine.add_request(f"r{i}", [5 + i] * 64, SamplingParams(max_tokens=8, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    pool_slots = engine.kv.usage().total_slots
    taken = free_at_start - _free_bytes()
    del engine
    assert pool_slots * 64 * 1024 > utilization * free_at_start / 2, "the pool must be sized by the share"
    return free_at_start, taken


def test_an_engine_takes_its_share_of_the_free_memory(tmp_path: Path) -> None:
    model_dir = _model_dir(tmp_path / "model")
    taken_by_share = {}
    for utilization in (0.2, 0.4):
        free_at_start, taken = _memory_taken(model_dir, utilization)
        target = utilization * free_at_start
        print(
            f"u={utilization}: free {free_at_start / GIB:.2f} GiB, "
            f"taken {taken / GIB:.2f} GiB (u*free {target / GIB:.2f})"
        )
        assert target - UNDERSHOOT_ALLOWED_BYTES <= taken <= target + OVERHEAD_ALLOWED_BYTES
        taken_by_share[utilization] = (free_at_start, taken)
    # what the overhead adds is the same at both shares: the difference is the share's alone
    (free_low, taken_low), (free_high, taken_high) = taken_by_share[0.2], taken_by_share[0.4]
    assert abs((taken_high - taken_low) - (0.4 * free_high - 0.2 * free_low)) <= UNDERSHOOT_ALLOWED_BYTES
