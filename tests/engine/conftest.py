"""Engine test fixtures: the embedded SmolLM2 loaded once per session (several engines share
its weights), and a tiny random Llama with SmolLM2's tokenizer for long request churn."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.engine_setup import build_engine_parts
from engine.loader.load import LoadedModel, load_model
from engine.loader.resolve import resolve_model
from engine.loader.tokenizer import Tokenizer
from engine.runner.options import RunnerOptions

EngineFactory = Callable[..., EngineCore]


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    return load_model("smollm2-135m", dtype=torch.float32, device="cpu", progress=False)


def _factory(loaded: LoadedModel) -> EngineFactory:
    def make(runner_options: RunnerOptions | None = None, **options: Any) -> EngineCore:
        options.setdefault("kv_cache_memory_bytes", 256 << 20)
        options.setdefault("max_model_len", 2048)
        config = EngineConfig(model=str(loaded.source.name), device="cpu", **options)
        return EngineCore(config, parts=build_engine_parts(config, loaded=loaded, runner_options=runner_options))

    return make


@pytest.fixture(scope="session")
def make_engine(smollm: LoadedModel) -> EngineFactory:
    """EngineCore over the shared SmolLM2 weights; keyword arguments are EngineConfig fields,
    and `runner_options` the runner's alternatives (engine/runner/options.py)."""
    return _factory(smollm)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama (HF format) with SmolLM2's tokenizer. Weights are scaled up so
    that greedy choices are not near-ties."""
    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = Tokenizer.from_source(resolve_model("smollm2-135m"))
    tokenizer.hf_tokenizer.save_pretrained(str(out))
    return save_random_llama(
        out,
        seed=0,
        weight_std=0.15,
        vocab_size=tokenizer.vocab_size,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def save_random_llama(out: Path, seed: int, weight_std: float, **config: Any) -> Path:
    """A 2-layer Llama (hidden 64, 4 q / 2 kv heads) with N(0, weight_std) matrices, saved
    in Hugging Face format into `out`; `config` sets the rest of LlamaConfig."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=1,
            eos_token_id=2,
            **config,
        )
    )
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, weight_std)
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def tiny(tiny_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu", progress=False)


@pytest.fixture(scope="session")
def make_tiny_engine(tiny: LoadedModel) -> EngineFactory:
    return _factory(tiny)


def save_word_tokenizer(out: Path, words: list[str]) -> None:
    """A whitespace word-level tokenizer: ids 0..2 are <unk>, <s>, </s>; then `words`."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *words])}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out))


@pytest.fixture(scope="session")
def small_vocab_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama over a 32-token vocabulary, for distribution tests."""
    out = tmp_path_factory.mktemp("small-vocab-llama")
    save_word_tokenizer(out, [f"w{i}" for i in range(29)])
    return save_random_llama(
        out, seed=1, weight_std=0.08, vocab_size=32, max_position_embeddings=512, tie_word_embeddings=False
    )


@pytest.fixture(scope="session")
def small_vocab(small_vocab_model_dir: Path) -> LoadedModel:
    return load_model(str(small_vocab_model_dir), dtype=torch.float32, device="cpu", progress=False)


@pytest.fixture(scope="session")
def make_small_vocab_engine(small_vocab: LoadedModel) -> EngineFactory:
    return _factory(small_vocab)


def random_drafter_dir(out: Path, loaded: LoadedModel, **overrides: Any) -> Path:
    """An untrained DSpark drafter for `loaded` (acceptance is low; losslessness must hold)."""
    from engine.speculative.checkpoint import save_drafter
    from engine.speculative.drafter import DSparkDrafter
    from engine.speculative.drafter_config import DrafterConfig

    config = DrafterConfig.for_target(loaded.config, loaded.name, **overrides)
    torch.manual_seed(2)
    drafter = DSparkDrafter(config)
    return save_drafter(out, drafter, config)


# Three short prompts of mixed lengths, for tests that compare two engines token for token.
SHORT_PROMPTS = [[1, 5, 7, 9], [1, 22, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 300]]


def tiny_drafter_or_none(model_dir: Path, out: Path, speculative: bool) -> Path | None:
    """A random gamma-4 drafter for the tiny model when `speculative`, else None."""
    if not speculative:
        return None
    tiny = load_model(str(model_dir), dtype=torch.float32, device="cpu", progress=False)
    return random_drafter_dir(out, tiny, gamma=4)
