"""Model loading: resolve → config → build the model on its device → stream the checkpoint's
tensors into this rank's shards → tokenizer.

    model, config, tokenizer = load_model("smollm2-135m", dtype="float32", device="cpu")

With `quantized=True` on CPU, a GGUF's block-quantized tensors stay in their formats, served
by the layers of engine/models/quantized.py (docs/design.md §2.9).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from engine.config import ModelConfig
from engine.distributed.parallel import tp_rank, tp_size
from engine.kernels.cpu.quant_gemm import BlockTensor
from engine.loader.gguf import block_formats, iter_gguf_tensors, open_gguf
from engine.loader.hf import count_safetensors, iter_safetensors, load_hf_config, safetensors_files
from engine.loader.resolve import ModelSource, resolve_model
from engine.loader.tokenizer import Tokenizer
from engine.models.quantized import quantize_modules
from engine.models.registry import get_model_class

Tensors = Iterator[tuple[str, torch.Tensor | BlockTensor]]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    try:
        return _DTYPES[dtype.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtype must be one of float32, bfloat16, float16; got {dtype!r}") from None


@dataclass
class Checkpoint:
    """An opened checkpoint: its config and a way to stream its tensors (HF names)."""

    source: ModelSource
    config: ModelConfig
    num_tensors: int
    # names -> tensors, those named streamed as their raw blocks (a GGUF's), the rest dense
    _tensors: Callable[[frozenset[str]], Tensors]
    # weight name -> block format, for tensors stored in one the quantized kernels serve
    block_formats: Mapping[str, str] = field(default_factory=dict)

    def tensors(self, keep_blocks: frozenset[str] = frozenset()) -> Tensors:
        return self._tensors(keep_blocks)


def open_checkpoint(source: ModelSource | str) -> Checkpoint:
    if not isinstance(source, ModelSource):
        source = resolve_model(source)
    if source.kind == "gguf":
        gguf = open_gguf(source.path)
        return Checkpoint(
            source, gguf.config, gguf.num_tensors, lambda keep: iter_gguf_tensors(gguf, keep), block_formats(gguf)
        )
    files = safetensors_files(source.path)
    return Checkpoint(source, load_hf_config(source.path), count_safetensors(files), lambda _: iter_safetensors(files))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    config: ModelConfig, dtype: torch.dtype | str = "float32", device: torch.device | str = "cpu"
) -> nn.Module:
    """The model for `config`, parameters uninitialised, allocated directly on `device` in
    `dtype` (this rank's tensor-parallel shards only)."""
    with torch.device(device), _default_dtype(parse_dtype(dtype)):
        model = get_model_class(config)(config)
    return model.eval()


def load_weights(
    model: nn.Module, checkpoint: Checkpoint, progress: bool = True, keep_blocks: frozenset[str] = frozenset()
) -> None:
    tensors = tqdm(
        checkpoint.tensors(keep_blocks),
        total=checkpoint.num_tensors,
        desc=f"Loading {checkpoint.source.name}",
        unit="tensor",
        disable=not progress or tp_rank() != 0,
    )
    with torch.no_grad():
        model.load_weights(tensors)  # type: ignore[operator]


@dataclass(frozen=True)
class LoadedModel:
    """What `load_model` returns; unpacks as `model, config, tokenizer = load_model(...)`."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    source: ModelSource

    @property
    def name(self) -> str:
        """The name the model was asked for (alias, path or repo id)."""
        return self.source.name

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.config, self.tokenizer))


def load_model(
    source: ModelSource | str,
    overrides: Mapping[str, Any] | None = None,
    dtype: torch.dtype | str = "float32",
    device: torch.device | str = "cpu",
    tensor_parallel_size: int = 1,
    tokenizer: ModelSource | str | None = None,
    progress: bool = True,
    quantized: bool = False,
) -> LoadedModel:
    """Load a model for this tensor-parallel rank.

    `overrides` replaces ModelConfig fields (e.g. `{"max_position": 8192}` to size the RoPE
    cache to the serving context). `tensor_parallel_size` must match the group set up by
    `engine.distributed.parallel.init_tensor_parallel`. `tokenizer` (a model, or a directory
    of tokenizer files) defaults to the model's own. The tokenizer's `eos_token_ids` include
    the config's EOS ids. `quantized` keeps a GGUF's tensors in the block formats the CPU
    kernels serve as they are (float32 activations, CPU, one rank); other tensors, and other
    checkpoints, load in `dtype`.
    """
    if tensor_parallel_size != tp_size():
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} but this process joined a TP group of {tp_size()}; "
            "call engine.distributed.parallel.init_tensor_parallel(tp_size, rank) first"
        )
    checkpoint = open_checkpoint(source)
    config = checkpoint.config
    if overrides:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)}
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) in overrides: {', '.join(sorted(unknown))}")
        config = config.replace(**overrides)
    model = build_model(config, dtype, device)
    keep_blocks: frozenset[str] = frozenset()
    if quantized and checkpoint.block_formats:
        if torch.device(device).type != "cpu" or parse_dtype(dtype) != torch.float32:
            raise ValueError(f"quantized weights are served on CPU with float32 activations, not {dtype} on {device}")
        keep_blocks = quantize_modules(model, checkpoint.block_formats, config.tie_word_embeddings)
    load_weights(model, checkpoint, progress, keep_blocks)
    tokenizer_source = checkpoint.source if tokenizer is None else _tokenizer_source(tokenizer)
    loaded_tokenizer = Tokenizer.from_source(tokenizer_source, extra_eos_token_ids=config.eos_token_ids)
    return LoadedModel(model, config, loaded_tokenizer, checkpoint.source)


def _tokenizer_source(tokenizer: ModelSource | str) -> ModelSource:
    """A model, or a directory holding only tokenizer files."""
    if isinstance(tokenizer, ModelSource):
        return tokenizer
    path = Path(tokenizer).expanduser()
    if path.is_dir() and any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return ModelSource(name=str(tokenizer), kind="hf", path=path)
    return resolve_model(tokenizer)
