"""GGUF files written here the way llama.cpp's converter writes them (its names, its q/k row
permutation for `llama`, none for Qwen, F32 or Q8_0 blocks) load into a model whose logits
match transformers on the same (dequantised) weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from random_models import random_hf_model

from engine.loader.gguf import _BLOCK_NAMES, _GLOBAL_NAMES
from engine.loader.load import build_model, load_weights, open_checkpoint

_TO_GGUF = {hf: gguf for gguf, hf in _GLOBAL_NAMES.items()}
_BLOCK_TO_GGUF = {hf: gguf for gguf, hf in _BLOCK_NAMES.items()}


def _gguf_name(hf_name: str) -> str:
    if hf_name in _TO_GGUF:
        return _TO_GGUF[hf_name]
    _, _, layer, *module, kind = hf_name.split(".")
    return f"blk.{layer}.{_BLOCK_TO_GGUF['.'.join(module)]}.{kind}"


def _llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    shape = weights.shape
    return weights.reshape(num_heads, 2, shape[0] // num_heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


@torch.no_grad()
def write_gguf(path, hf_model, arch: str, quantized: bool) -> None:
    """Write `hf_model` as llama.cpp would; when `quantized`, matrices become Q8_0 and the
    model's own weights are replaced by their dequantised values (the reference)."""
    import gguf

    config = hf_model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.float().numpy()
        if quantized and values.ndim == 2:
            blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(values.shape)
            tensor.copy_(torch.from_numpy(values))
        if arch == "llama" and ".q_proj." in name:
            values = _llama_cpp_permute(values, config.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            values = _llama_cpp_permute(values, config.num_key_value_heads)
        if quantized and values.ndim == 2:
            blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(_gguf_name(name), blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(_gguf_name(name), np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("arch", "family", "quantized"),
    [("llama", "llama", True), ("qwen2", "qwen2", False), ("qwen3", "qwen3", True)],
)
def test_gguf_checkpoint_matches_transformers(tmp_path, arch, family, quantized):
    hf_model = random_hf_model(family, seed=7)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, hf_model, arch, quantized)

    checkpoint = open_checkpoint(str(path))
    config = checkpoint.config
    assert checkpoint.source.kind == "gguf" and config.architecture == arch
    assert config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert config.attention_bias == (arch == "qwen2") and config.qk_norm == (arch == "qwen3")
    assert config.head_dim == (getattr(hf_model.config, "head_dim", None) or 16)
    model = build_model(config)
    load_weights(model, checkpoint, progress=False)

    from model_harness import greedy_generate

    prompt = torch.randint(0, config.vocab_size, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    generated = greedy_generate(model, prompt, 6)
    with torch.inference_mode():
        ref = hf_model(torch.tensor([prompt + generated.tokens[:-1]])).logits[0, len(prompt) - 1 :]
    assert generated.tokens == ref.argmax(-1).tolist()
    assert float((torch.stack(generated.logits) - ref).abs().max()) < 1e-3
