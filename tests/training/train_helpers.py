"""Shared pieces of the drafter-training tests: a tiny random Llama target, a word-hash
tokenizer with a chat template, and a drafter shaped for that target."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from engine.config import ModelConfig
from engine.loader.load import build_model
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig

VOCAB = 64
BOS, EOS, PAD = 1, 2, 0
TURN_START, TURN_SEP = 3, 4
FIRST_WORD_ID = 8
LM_HEAD_SCALE = 4.0


def tiny_target_config(**overrides: Any) -> ModelConfig:
    fields: dict[str, Any] = dict(
        architecture="llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        max_position=512,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_ids=(EOS,),
        pad_token_id=PAD,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_target(config: ModelConfig | None = None, seed: int = 0) -> nn.Module:
    """A Llama-family model with random weights: unit-variance embeddings, 1/sqrt(fan_in)
    projections, and an LM head scaled so that next-token distributions are peaked."""
    config = config or tiny_target_config()
    model = build_model(config, "float32", "cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif "embed" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            elif name.startswith("lm_head"):
                param.copy_(torch.randn(param.shape, generator=gen) * LM_HEAD_SCALE * param.shape[-1] ** -0.5)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * param.shape[-1] ** -0.5)
    return model.eval()


def tiny_drafter_config(target_config: ModelConfig, **overrides: Any) -> DrafterConfig:
    fields: dict[str, Any] = dict(gamma=4, num_layers=1, markov_rank=16)
    fields.update(overrides)
    return DrafterConfig.for_target(target_config, "tiny-target", **fields)


def tiny_drafter(target: nn.Module, config: DrafterConfig, seed: int = 0, random_norms: bool = False) -> DSparkDrafter:
    """A drafter with every weight random (including a non-zero Markov head), bound to target."""
    torch.manual_seed(seed)
    drafter = DSparkDrafter(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise if random_norms else torch.ones_like(noise))
            else:
                param.copy_(noise * param.shape[-1] ** -0.5)
    drafter.bind_target(target.embed, target.compute_logits)
    return drafter


class WordTokenizer:
    """Words hashed into the tiny vocabulary; a ChatML-like template of special ids."""

    chat_template = "tiny"

    def __init__(self) -> None:
        self.eos_token_ids = (EOS,)
        self.bos_token_id = BOS

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        parts = [f"<s> {m['role']} : {m['content']} </t>" for m in messages]
        if add_generation_prompt:
            parts.append("<s> assistant :")
        return " ".join(parts)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        specials = {"<s>": TURN_START, "</t>": EOS, ":": TURN_SEP}
        ids = [BOS] if add_special_tokens else []
        for word in text.split():
            ids.append(specials.get(word, FIRST_WORD_ID + zlib.crc32(word.lower().encode()) % (VOCAB - FIRST_WORD_ID)))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"w{i}" for i in ids)


def successor_target(config: ModelConfig | None = None, seed: int = 0, sharpness: float = 1.0) -> nn.Module:
    """A target whose next token is a fixed random bijection of the current one, t -> succ[t]:
    every layer writes zero into the residual stream (o_proj and down_proj are 0), so the
    final hidden is norm(E[t]), and the LM head row of succ[t] is E[t] (scaled). Its greedy
    answers follow the chain t, succ[t], succ[succ[t]], ...: a deterministic structure that a
    drafter can learn, while chance acceptance is about 1 / vocab."""
    config = config or tiny_target_config()
    model = tiny_target(config, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    succ = torch.randperm(config.vocab_size, generator=gen)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        unit = embed / embed.norm(dim=-1, keepdim=True)
        model.lm_head.weight[succ] = unit * sharpness
    model.successor = succ  # type: ignore[assignment]
    return model


HF_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_hf_target(directory: Any, model: nn.Module, config: ModelConfig) -> None:
    """Write `model` as a Hugging Face Llama directory (config.json, model.safetensors with the
    checkpoint's unfused names) with a character-level tokenizer and a ChatML template."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    q, kv = config.q_size, config.kv_size
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().contiguous()
        if name.endswith("qkv_proj.weight"):
            base = name.removesuffix("qkv_proj.weight")
            for part, rows in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv]), strict=True):
                tensors[f"{base}{part}.weight"] = rows.contiguous()
        elif name.endswith("gate_up_proj.weight"):
            base = name.removesuffix("gate_up_proj.weight")
            gate, up = tensor.chunk(2)
            tensors[f"{base}gate_proj.weight"] = gate.contiguous()
            tensors[f"{base}up_proj.weight"] = up.contiguous()
        else:
            tensors[name] = tensor
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": config.vocab_size,
                "hidden_size": config.hidden_size,
                "intermediate_size": config.intermediate_size,
                "num_hidden_layers": config.num_layers,
                "num_attention_heads": config.num_heads,
                "num_key_value_heads": config.num_kv_heads,
                "head_dim": config.head_dim,
                "max_position_embeddings": config.max_position,
                "rms_norm_eps": config.rms_norm_eps,
                "rope_theta": config.rope_theta,
                "tie_word_embeddings": config.tie_word_embeddings,
                "bos_token_id": BOS,
                "eos_token_id": EOS,
                "pad_token_id": PAD,
                "torch_dtype": "float32",
            }
        )
    )
    specials = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "<unk>"]
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 .,?!:;'\"-()\n")
    vocab = {token: i for i, token in enumerate(specials + chars)}
    assert len(vocab) <= config.vocab_size
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = HF_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))
