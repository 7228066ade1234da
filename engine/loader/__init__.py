"""Model loading: resolve a name to a checkpoint, read its config, build the model and stream
its weights (Hugging Face safetensors or GGUF), and wrap its tokenizer."""

from engine.loader.load import LoadedModel, load_model
from engine.loader.resolve import ModelNotFoundError, ModelSource, resolve_model
from engine.loader.tokenizer import Tokenizer

__all__ = ["LoadedModel", "ModelNotFoundError", "ModelSource", "Tokenizer", "load_model", "resolve_model"]
