"""The engine fixtures the logit-bias engine tests share with tests/engine: the tiny random
Llama (SmolLM2's tokenizer) and the 32-token Llama, each loaded once per session."""

from tests.engine.conftest import (  # noqa: F401  (pytest finds fixtures by name)
    make_small_vocab_engine,
    make_tiny_engine,
    small_vocab,
    small_vocab_model_dir,
    tiny,
    tiny_model_dir,
)
