"""GGUF checkpoints (llama.cpp's format): metadata → ModelConfig, tensors → float32 with
Hugging Face names, or, for a quantized CPU engine, the block-quantized tensors as stored.

Tensors are dequantised with `gguf.quants.dequantize`, except those a quantized engine keeps
in their block format (`block_formats`, docs/design.md §2.9). Three things differ from a Hugging
Face checkpoint and are undone here:

- names: `blk.N.attn_q.weight` → `model.layers.N.self_attn.q_proj.weight`, etc.;
- shapes: GGUF lists dimensions innermost first; numpy arrays from the reader are already in
  torch (row-major) order, which `_torch_shape` asserts;
- llama.cpp's converter permutes the rows of attn_q/attn_k of `llama` models so that its
  RoPE can rotate adjacent pairs (GPT-J layout); we rotate halves (NeoX / Hugging Face layout)
  and invert that permutation exactly as transformers' GGUF loader does. Qwen2/Qwen3 files
  are converted without the permutation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.config import ModelConfig, RopeScaling
from engine.kernels.cpu.quant_gemm import FORMATS, BlockTensor
from engine.loader.resolve import ModelNotFoundError

# GGUF general.architecture -> registry key
_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
# Architectures whose q/k rows llama.cpp permutes on conversion.
_PERMUTED_QK = {"llama", "mistral"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Tensors that carry no parameter: RoPE frequency factors (read into the config instead).
_SKIPPED = {"rope_freqs.weight"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


@dataclass
class GGUFCheckpoint:
    path: Path
    reader: Any  # gguf.GGUFReader (memory-mapped)
    architecture: str  # general.architecture as the file states it
    config: ModelConfig

    @property
    def num_tensors(self) -> int:
        return len(self.reader.tensors)


def open_gguf(path: Path) -> GGUFCheckpoint:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except OSError as e:
        raise ModelNotFoundError(f"cannot read the GGUF file {path}: {e.strerror}") from e
    except Exception as e:  # a truncated or corrupt file
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e
    architecture = _field(reader, "general.architecture")
    return GGUFCheckpoint(path=path, reader=reader, architecture=architecture, config=config_from_gguf(reader))


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def config_from_gguf(reader: Any) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch is None:
        raise ValueError("GGUF file has no general.architecture")

    def key(name: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{name}", default)

    tensors = {t.name: t for t in reader.tensors}
    hidden_size = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    num_kv_heads = key("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):  # per-layer counts
        if len(set(num_kv_heads)) != 1:
            raise ValueError(f"GGUF: per-layer KV head counts {sorted(set(num_kv_heads))} are not supported")
        num_kv_heads = num_kv_heads[0]
    head_dim = int(key("attention.key_length") or hidden_size // num_heads)
    rope_dim = int(key("rope.dimension_count") or head_dim)
    theta = float(key("rope.freq_base", 10000.0))
    vocab_size = key("vocab_size")
    if vocab_size is None:
        vocab_size = len(reader.fields["tokenizer.ggml.tokens"].data)

    scaling: RopeScaling | None = None
    max_position = int(key("context_length", 4096))
    scaling_type = key("rope.scaling.type")
    if "rope_freqs.weight" in tensors:
        scaling = _llama3_from_rope_freqs(_dequantize(tensors["rope_freqs.weight"]), theta, rope_dim)
    elif scaling_type == "linear":
        scaling = RopeScaling(kind="linear", factor=float(key("rope.scaling.factor")))
    elif scaling_type == "yarn":
        original = int(key("rope.scaling.original_context_length") or max_position)
        factor = float(key("rope.scaling.factor"))
        scaling = RopeScaling(kind="yarn", factor=factor, original_max_position=original)
        max_position = max(max_position, int(original * factor))
    elif scaling_type not in (None, "none"):
        raise ValueError(f"GGUF: rope scaling type {scaling_type!r} is not supported")

    def token_id(name: str) -> int | None:
        value = _field(reader, f"tokenizer.ggml.{name}")
        return int(value) if value is not None else None

    eos = token_id("eos_token_id")
    file_type = _field(reader, "general.file_type")
    try:
        from gguf import LlamaFileType

        weight_dtype = f"gguf:{LlamaFileType(file_type).name}" if file_type is not None else "gguf"
    except (ImportError, ValueError):
        weight_dtype = "gguf"
    return ModelConfig(
        architecture=_ARCHITECTURES.get(arch, arch),
        vocab_size=int(vocab_size),
        hidden_size=hidden_size,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(num_kv_heads),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_dim=rope_dim if rope_dim != head_dim else None,
        max_position=max_position,
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=token_id("bos_token_id"),
        eos_token_ids=(eos,) if eos is not None else (),
        pad_token_id=token_id("padding_token_id"),
        weight_dtype=weight_dtype,
    )


def _llama3_from_rope_freqs(freq_factors: np.ndarray, theta: float, rope_dim: int) -> RopeScaling:
    """llama.cpp stores Llama 3.1 RoPE scaling as per-frequency divisors (`rope_freqs`), built
    with low/high frequency factors 1/4 and an 8192-token original context. Recover the
    RopeScaling, checking that it reproduces the stored divisors."""
    factor = float(freq_factors.max())
    scaling = RopeScaling(
        kind="llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
    )
    inv_freq = 1.0 / (theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim))
    expected = []
    for freq in inv_freq:
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4.0:
            expected.append(1.0)
        elif wavelen > 8192 / 1.0:
            expected.append(factor)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            expected.append(1 / ((1 - smooth) / factor + smooth))
    if not np.allclose(np.asarray(expected), freq_factors.astype(np.float64), rtol=1e-4, atol=1e-5):
        raise ValueError("GGUF: rope_freqs does not match Llama 3 RoPE scaling; it is not supported")
    return scaling


def _torch_shape(tensor: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in reversed(tensor.shape))


def _dequantize(tensor: Any) -> np.ndarray:
    from gguf.quants import dequantize

    values = dequantize(tensor.data, tensor.tensor_type)
    shape = _torch_shape(tensor)
    if values.size != math.prod(shape):
        raise ValueError(f"GGUF tensor {tensor.name}: {values.size} values for shape {shape}")
    return values.reshape(shape)


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor; None for tensors to skip."""
    if gguf_name in _SKIPPED:
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.match(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} is not part of a supported Llama-family model")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def reverse_qk_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's `permute` of q/k rows: per head, rows were reordered from
    [first half | second half] to interleaved pairs; put them back. Works for bias vectors too."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def block_formats(ckpt: GGUFCheckpoint) -> dict[str, str]:
    """Hugging Face weight name -> GGUF block format, for each 2-D tensor stored in a format
    the quantized CPU kernels serve (engine/kernels/cpu/quant_gemm.py)."""
    formats = {}
    for tensor in ckpt.reader.tensors:
        name = hf_name(tensor.name)
        fmt = tensor.tensor_type.name
        if name is not None and fmt in FORMATS and len(tensor.shape) == 2:
            formats[name] = fmt
    return formats


def iter_gguf_tensors(
    ckpt: GGUFCheckpoint, keep_blocks: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor | BlockTensor]]:
    """(Hugging Face name, tensor) for each parameter tensor, one at a time: the raw blocks of
    those named in `keep_blocks` (block_formats), the others dequantised to float32."""
    config = ckpt.config
    permute = ckpt.architecture in _PERMUTED_QK
    for tensor in ckpt.reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        if name in keep_blocks:
            # [N, K / 32 * block_bytes] uint8, a view of the file: row n holds output feature n's
            # blocks, so permuting q/k rows moves whole rows of blocks.
            values = torch.from_numpy(np.require(tensor.data, dtype=np.uint8, requirements=["C", "W"]))
        else:
            values = torch.from_numpy(np.require(_dequantize(tensor), dtype=np.float32, requirements=["C", "W"]))
        if permute and ".self_attn.q_proj." in name:
            values = reverse_qk_permute(values, config.num_heads)
        elif permute and ".self_attn.k_proj." in name:
            values = reverse_qk_permute(values, config.num_kv_heads)
        yield name, BlockTensor(tensor.tensor_type.name, values) if name in keep_blocks else values
