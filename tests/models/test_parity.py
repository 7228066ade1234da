"""Our Llama-family model against Hugging Face transformers on the same weights: greedy
tokens equal and logits within 1e-3 (fp32, CPU), for the embedded SmolLM2 (from its GGUF)
and for random checkpoints of every family and RoPE scaling we support."""

from __future__ import annotations

import pytest
import torch
from model_harness import DenseTestBackend, default_backend, greedy_generate, make_cache, make_metadata
from random_models import FAMILIES, hf_greedy, save_random_hf_model

from engine.loader.load import build_model, load_weights, open_checkpoint
from engine.models.context import ForwardContext
from tests.data.prompts import CHAT_PROMPTS

LOGIT_TOL = 1e-3


def _max_diff(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(ours, ref, strict=True))


def _check_smollm2(smollm2, hf_model, conversations, max_new_tokens: int) -> float:
    """Greedy-decode each chat prompt with our model (prefill, then one token per forward
    through the KV cache), then run transformers once over prompt + our tokens. Our tokens are
    transformers' greedy tokens iff each is the argmax of transformers' logits at the position
    before it (by induction over the steps), and there the logits must agree to LOGIT_TOL.
    One teacher-forced forward costs a fraction of transformers' own token-by-token loop."""
    worst = 0.0
    for i, conversation in enumerate(conversations):
        tokenizer = smollm2.tokenizer
        prompt = tokenizer.encode(tokenizer.apply_chat_template(conversation), add_special_tokens=False)
        ours = greedy_generate(smollm2.model, prompt, max_new_tokens)
        with torch.inference_mode():
            sequence = torch.tensor([prompt + ours.tokens[:-1]])
            ref_logits = hf_model(sequence).logits[0, len(prompt) - 1 :].float()  # [new tokens, V]
        ref_tokens = ref_logits.argmax(dim=-1).tolist()
        diff = _max_diff(ours.logits, list(ref_logits))
        print(f"prompt {i}: {len(prompt)} prompt tokens, max |logit diff| {diff:.2e}")
        assert ours.tokens == ref_tokens, f"prompt {i}: greedy tokens differ from transformers"
        assert diff < LOGIT_TOL, f"prompt {i}: logits differ by {diff}"
        worst = max(worst, diff)
    print(f"{len(conversations)} prompts x {max_new_tokens} tokens: worst max |logit diff| {worst:.2e}")
    return worst


def test_smollm2_matches_transformers(smollm2, hf_smollm2):
    _check_smollm2(smollm2, hf_smollm2, CHAT_PROMPTS[:4], 64)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_smollm2_matches_transformers_all_prompts(smollm2, hf_smollm2):
    _check_smollm2(smollm2, hf_smollm2, CHAT_PROMPTS, 64)


def _load_ours(directory, dtype="float32"):
    checkpoint = open_checkpoint(str(directory))
    model = build_model(checkpoint.config, dtype=dtype)
    load_weights(model, checkpoint, progress=False)
    return model


def _prompt(length: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_family_matches_transformers(tmp_path, family):
    hf_model = save_random_hf_model(tmp_path, family, max_shard_size="100KB" if family == "qwen3" else None)
    if family == "qwen3":
        assert (tmp_path / "model.safetensors.index.json").is_file()  # sharded checkpoint
    model = _load_ours(tmp_path)
    prompt = _prompt(13, hf_model.config.vocab_size, seed=len(family))

    # every prefill position
    cache = make_cache(model, 1, 64)
    meta, positions = make_metadata(cache, [0], [0], [len(prompt)])
    ids = torch.tensor(prompt)
    with torch.inference_mode():
        hidden = model(ids, positions, ForwardContext(meta=meta, kv=cache, backend=default_backend()))
        ours = model.compute_logits(hidden)
        ref = hf_model(ids[None]).logits[0]
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    assert float((ours - ref).abs().max()) < LOGIT_TOL

    generated = greedy_generate(model, prompt, 24)
    ref_tokens, ref_logits = hf_greedy(hf_model, prompt, 24)
    assert generated.tokens == ref_tokens
    assert _max_diff(generated.logits, ref_logits) < LOGIT_TOL


def test_dense_reference_backend_agrees(tmp_path):
    """Chunked prefill through our own dense attention gives the same tokens and logits."""
    save_random_hf_model(tmp_path, "qwen3")
    model = _load_ours(tmp_path)
    prompt = _prompt(17, 384, seed=1)
    reference = greedy_generate(model, prompt, 8)
    chunked = greedy_generate(model, prompt, 8, backend=DenseTestBackend(), prefill_chunk=5)
    assert chunked.tokens == reference.tokens
    assert _max_diff(chunked.logits, reference.logits) < 1e-4


def test_ragged_batch_matches_single_requests(tmp_path):
    """Two requests in one forward (ragged prefill, then decode + extend) give each row the
    logits of its own sequence."""
    hf_model = save_random_hf_model(tmp_path, "qwen2")
    model = _load_ours(tmp_path)
    seq_a, seq_b = _prompt(9, 384, seed=2), _prompt(8, 384, seed=3)
    with torch.inference_mode():
        ref_a, ref_b = hf_model(torch.tensor([seq_a])).logits[0], hf_model(torch.tensor([seq_b])).logits[0]
    cache = make_cache(model, 3, 32)
    backend = default_backend()
    rows = [2, 0]  # request rows need not be ordered
    steps = [([0, 0], [7, 5]), ([7, 5], [1, 3])]  # (prefix lens, extend lens) per forward
    for prefix_lens, extend_lens in steps:
        meta, positions = make_metadata(cache, rows, prefix_lens, extend_lens)
        tokens = (
            seq_a[prefix_lens[0] : prefix_lens[0] + extend_lens[0]]
            + seq_b[prefix_lens[1] : prefix_lens[1] + extend_lens[1]]
        )
        with torch.inference_mode():
            hidden = model(torch.tensor(tokens), positions, ForwardContext(meta=meta, kv=cache, backend=backend))
            logits = model.compute_logits(hidden)
        expected = torch.cat(
            [
                ref_a[prefix_lens[0] : prefix_lens[0] + extend_lens[0]],
                ref_b[prefix_lens[1] : prefix_lens[1] + extend_lens[1]],
            ]
        )
        assert float((logits - expected).abs().max()) < LOGIT_TOL


def test_capture_layers_and_input_embeds(tmp_path):
    hf_model = save_random_hf_model(tmp_path, "llama3")
    model = _load_ours(tmp_path)
    prompt = _prompt(10, 384, seed=4)
    ids = torch.tensor(prompt)
    with torch.inference_mode():
        hf_hidden = hf_model(ids[None], output_hidden_states=True).hidden_states  # [embeddings, layer 0, ...]
        results = []
        for input_embeds in (None, model.embed(ids)):
            cache = make_cache(model, 1, 16)
            meta, positions = make_metadata(cache, [0], [0], [len(prompt)])
            ctx = ForwardContext(meta=meta, kv=cache, backend=default_backend(), capture_layers=(1, 0))
            hidden = model(ids, positions, ctx, input_embeds=input_embeds)
            results.append((hidden, ctx))
    (hidden, ctx), (hidden_from_embeds, _) = results
    assert len(ctx.captured) == 2  # in capture_layers order: layer 1, then layer 0
    assert float((ctx.captured[0] - hf_hidden[2][0]).abs().max()) < 1e-4
    assert float((ctx.captured[1] - hf_hidden[1][0]).abs().max()) < 1e-4
    assert ctx.aux_hidden().shape == (len(prompt), 2 * hf_model.config.hidden_size)
    assert torch.equal(hidden, hidden_from_embeds)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_transformers(tmp_path, dtype):
    hf_model = save_random_hf_model(tmp_path, "qwen3")
    model = _load_ours(tmp_path, dtype=dtype)
    assert next(model.parameters()).dtype == dtype
    prompt = _prompt(12, 384, seed=5)
    generated = greedy_generate(model, prompt, 4)
    assert all(logits.dtype == torch.float32 and torch.isfinite(logits).all() for logits in generated.logits)
    with torch.inference_mode():
        ref = hf_model.to(dtype)(torch.tensor([prompt])).logits[0, -1].float()
    scale = float(ref.abs().max())
    assert float((generated.logits[0] - ref).abs().max()) < 0.05 * scale
