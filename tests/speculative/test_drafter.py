"""DSparkDrafter: shapes, non-causal block attention, KV injection, and propose against a
dense reference that recomputes the context K/V from the target hidden states."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from spec_helpers import FakeTarget, make_drafter, make_scenario, sync_guard, tiny_config

from engine.kernels import silu_and_mul
from engine.speculative.drafter import DrafterLayer, DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig


def dense_block(
    drafter: DSparkDrafter, target: FakeTarget, aux: torch.Tensor, anchor: int, temperature_zero: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One request, no cache: (hidden [g, H], draft tokens [g], step logits [g, V], confidence [g]).
    Context K/V are recomputed from `aux` [n, K*H] (positions 0..n-1); the block sits at n."""
    cfg = drafter.config
    g, n = cfg.gamma, aux.shape[0]
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ctx_pos = torch.arange(n)
    pos = n + torch.arange(g)
    context = drafter.hidden_norm(aux @ drafter.fc.weight.T)
    ids = torch.tensor([anchor] + [cfg.mask_token_id] * (g - 1))
    x = target.embed(ids)
    for i, layer in enumerate(cast(list[DrafterLayer], list(drafter.layers))):
        attn = layer.self_attn
        w = drafter.kv_proj[i]
        ck, cv = (context @ w.T).view(n, 2, hkv, d).unbind(1)
        _, ck = drafter.rotary_emb(ctx_pos, ck, attn.k_norm(ck))
        h = layer.input_layernorm(x)
        q = attn.q_norm((h @ attn.q_proj.weight.T).view(g, hq, d))
        k, v = (h @ w.T).view(g, 2, hkv, d).unbind(1)
        q, k = drafter.rotary_emb(pos, q, attn.k_norm(k))
        keys = torch.cat([ck, k]).repeat_interleave(hq // hkv, dim=1)  # [n+g, Hq, D]
        values = torch.cat([cv, v]).repeat_interleave(hq // hkv, dim=1)
        probs = torch.softmax(torch.einsum("qhd,khd->hqk", q, keys) * d**-0.5, dim=-1)  # no mask
        out = torch.einsum("hqk,khd->qhd", probs, values).reshape(g, hq * d)
        x = x + out @ attn.o_proj.weight.T
        x = x + silu_and_mul(layer.post_attention_layernorm(x) @ layer.gate_up_proj.weight.T) @ layer.down_proj.weight.T
    hidden = drafter.norm(x)
    base = target.compute_logits(hidden)
    tokens, steps, prev_embeds = [], [], []
    prev = anchor
    for i in range(g):
        e = drafter.markov.w1[prev]
        step = base[i] + e @ drafter.markov.w2
        prev = int(step.argmax())
        tokens.append(prev)
        steps.append(step)
        prev_embeds.append(e)
    assert drafter.confidence is not None
    head = drafter.confidence.proj
    conf = torch.sigmoid(torch.cat([hidden, torch.stack(prev_embeds)], -1) @ head.weight.T + head.bias).squeeze(-1)
    return hidden, torch.tensor(tokens), torch.stack(steps), conf


@pytest.mark.parametrize(
    "overrides", [{}, {"num_layers": 1, "rope_dim": 4, "num_kv_heads": 1}, {"num_layers": 3, "gamma": 2}]
)
@torch.no_grad()
def test_inject_then_propose_matches_dense_reference(overrides: dict[str, object]) -> None:
    cfg = tiny_config(**overrides)
    drafter, target = make_drafter(cfg, seed=3)
    scen = make_scenario(cfg, [5, 9, 1], seed=4)
    aux, positions, slots = scen.flat_context()
    anchor = torch.tensor([7, 0, 45])
    ctx, block_pos = scen.block_context(cfg.gamma)
    zeros = torch.zeros(scen.batch)
    keys = torch.arange(scen.batch)
    with sync_guard():
        drafter.inject_kv(aux, positions, slots, scen.pool)
        prop = drafter.propose(anchor, ctx, block_pos, zeros, keys, keys)
    g, v = cfg.gamma, cfg.vocab_size
    assert prop.draft_tokens.shape == (3, g) and prop.draft_tokens.dtype == torch.int64
    assert prop.draft_logits.shape == (3, g, v) and prop.draft_logits.dtype == torch.float32
    assert prop.confidence is not None and prop.confidence.shape == (3, g)
    for b in range(scen.batch):
        _, tokens, steps, conf = dense_block(drafter, target, scen.aux[b], int(anchor[b]))
        torch.testing.assert_close(prop.draft_logits[b], steps, rtol=1e-4, atol=1e-4)
        assert torch.equal(prop.draft_tokens[b], tokens)
        torch.testing.assert_close(prop.confidence[b], conf, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_context_kv_is_what_inject_stores() -> None:
    cfg = tiny_config(rope_dim=4)
    drafter, _ = make_drafter(cfg, seed=5)
    scen = make_scenario(cfg, [6, 3], seed=6)
    aux, positions, all_slots = scen.flat_context()
    slots = torch.where(torch.arange(all_slots.shape[0]) % 4 == 3, -1, all_slots)  # some skipped tokens
    drafter.inject_kv(aux, positions, slots, scen.pool)
    expected = drafter.context_kv(aux, positions)
    written = slots >= 0
    for i, (k, v) in enumerate(expected):
        k_cache, v_cache = scen.pool.layer(i)
        torch.testing.assert_close(k_cache[slots[written]], k[written], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache[slots[written]], v[written])
        assert torch.isnan(k_cache[all_slots[~written]]).all()  # skipped: left alone


@torch.no_grad()
def test_block_attention_is_non_causal() -> None:
    """Row i of the block sees rows after it: changing the input at j changes rows i < j.
    With a causal block (the property's control) rows before j are untouched."""
    cfg = tiny_config(gamma=5)
    drafter, _ = make_drafter(cfg, seed=7)
    scen = make_scenario(cfg, [4, 7], seed=8)
    aux, positions, slots = scen.flat_context()
    drafter.inject_kv(aux, positions, slots, scen.pool)
    ids = drafter.block_input_ids(torch.tensor([3, 11]))  # [B, gamma]
    changed = ids.clone()
    changed[:, 3] = 20
    for causal in (False, True):
        ctx, pos = scen.block_context(cfg.gamma, causal=causal)
        h0 = drafter(ids.reshape(-1), pos.reshape(-1), ctx).view(2, cfg.gamma, -1)
        ctx, pos = scen.block_context(cfg.gamma, causal=causal)
        h1 = drafter(changed.reshape(-1), pos.reshape(-1), ctx).view(2, cfg.gamma, -1)
        before = (h0[:, :3] - h1[:, :3]).abs().amax(dim=-1)  # [B, 3]
        if causal:
            assert before.max() < 1e-6
        else:
            assert (before > 1e-3).all()
        assert ((h0[:, 3] - h1[:, 3]).abs().amax(dim=-1) > 1e-3).all()


@torch.no_grad()
def test_propose_sampling_is_counter_based() -> None:
    """Sampled drafts are a function of (key, counter) and the request's own context alone:
    reruns repeat, equal keys agree, another counter differs, and batch company is irrelevant."""
    cfg = tiny_config()
    drafter, _ = make_drafter(cfg, seed=9)

    def run(
        num_reqs: int, temp: list[float], key: list[int], counter: list[int], any_sampled: bool = True
    ) -> torch.Tensor:
        scen = make_scenario(cfg, [5] * num_reqs, seed=10 + num_reqs)
        scen.aux = [make_scenario(cfg, [5], seed=10).aux[0]] * num_reqs  # the same context everywhere
        aux, positions, slots = scen.flat_context()
        drafter.inject_kv(aux, positions, slots, scen.pool)
        ctx, pos = scen.block_context(cfg.gamma)
        anchor = torch.full((num_reqs,), 2)
        with sync_guard():
            prop = drafter.propose(
                anchor,
                ctx,
                pos,
                torch.tensor(temp),
                torch.tensor(key),
                torch.tensor(counter),
                any_sampled=any_sampled,
            )
        return prop.draft_tokens

    temp, key, counter = [0.0, 1.5, 1.5, 1.5], [11, 12, 12, 12], [0, 0, 0, 1]
    first = run(4, temp, key, counter)
    assert torch.equal(first, run(4, temp, key, counter))
    assert torch.equal(first[1], first[2])
    assert not torch.equal(first[2], first[3])
    assert torch.equal(first[1:2], run(1, [1.5], [12], [0]))  # alone in the batch: the same draft
    assert torch.equal(first[0:1], run(1, [0.0], [99], [7], any_sampled=False))  # greedy ignores the draws


def test_propose_rejects_a_causal_or_misshapen_block() -> None:
    cfg = tiny_config()
    drafter, _ = make_drafter(cfg)
    scen = make_scenario(cfg, [3], seed=1)
    z = torch.zeros(1, dtype=torch.int64)
    ctx, pos = scen.block_context(cfg.gamma, causal=True)
    with pytest.raises(ValueError, match="non-causal"):
        drafter.propose(z, ctx, pos, z.float(), z, z)
    ctx, pos = scen.block_context(cfg.gamma + 1)
    with pytest.raises(ValueError, match="gamma"):
        drafter.propose(z, ctx, pos, z.float(), z, z)


def test_unbound_drafter_says_what_is_missing() -> None:
    cfg = tiny_config()
    drafter = DSparkDrafter(cfg)
    scen = make_scenario(cfg, [3], seed=1)
    z = torch.zeros(1, dtype=torch.int64)
    ctx, pos = scen.block_context(cfg.gamma)
    with pytest.raises(RuntimeError, match="bind_target"):
        drafter.propose(z, ctx, pos, z.float(), z, z)


def test_shared_modules_are_not_drafter_state() -> None:
    cfg = tiny_config(confidence_head=False)
    drafter, _ = make_drafter(cfg)
    names = set(drafter.state_dict())
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert not any(n.startswith("confidence") for n in names)
    assert "kv_proj" in names and "markov.w1" in names and "markov.w2" in names
    assert drafter.markov.w1.shape == (cfg.vocab_size, cfg.markov_rank)
    assert drafter.markov.w2.shape == (cfg.markov_rank, cfg.vocab_size)


def test_no_confidence_head_gives_none() -> None:
    cfg = tiny_config(confidence_head=False)
    drafter, _ = make_drafter(cfg)
    scen = make_scenario(cfg, [3], seed=2)
    aux, positions, slots = scen.flat_context()
    drafter.inject_kv(aux, positions, slots, scen.pool)
    ctx, pos = scen.block_context(cfg.gamma)
    z = torch.zeros(1, dtype=torch.int64)
    assert drafter.propose(z, ctx, pos, z.float(), z, z).confidence is None


def test_bf16_drafter_runs() -> None:
    cfg = tiny_config()
    drafter, target = make_drafter(cfg)
    drafter.to(torch.bfloat16)
    target.embedding = target.embedding.bfloat16()
    scen = make_scenario(cfg, [4, 2], seed=3, dtype=torch.bfloat16)
    aux, positions, slots = scen.flat_context()
    drafter.inject_kv(aux, positions, slots, scen.pool)
    ctx, pos = scen.block_context(cfg.gamma)
    z = torch.zeros(2, dtype=torch.int64)
    prop = drafter.propose(z, ctx, pos, torch.tensor([0.0, 1.0]), z, z)
    assert prop.draft_logits.dtype == torch.float32 and torch.isfinite(prop.draft_logits).all()


def test_default_capture_layers_and_config_checks() -> None:
    from engine.speculative.drafter_config import default_capture_layers

    assert default_capture_layers(30, 3) == (1, 14, 27)
    assert default_capture_layers(30, 1) == (15,)
    assert default_capture_layers(4, 3) == (0, 2, 3)
    for layers in range(1, 40):
        for k in range(1, min(layers, 6) + 1):
            ids = default_capture_layers(layers, k)
            assert len(ids) == k and list(ids) == sorted(set(ids)) and ids[0] >= 0 and ids[-1] < layers
    with pytest.raises(ValueError, match="num_layers"):
        tiny_config(num_layers=4)
    with pytest.raises(ValueError, match="mask_token_id"):
        tiny_config(mask_token_id=48)
    with pytest.raises(ValueError, match="capture_layers"):
        tiny_config(capture_layers=(2, 1))
    cfg = tiny_config(capture_layers=(0, 5))
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg


def test_for_target_defaults() -> None:
    from engine.config import ModelConfig, RopeScaling

    target = ModelConfig(
        architecture="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        pad_token_id=2,
        eos_token_ids=(2,),
        rope_scaling=RopeScaling(kind="linear", factor=2.0),
    )
    cfg = DrafterConfig.for_target(target, "smollm2-135m", num_layers=2)
    assert cfg.capture_layers == (1, 14, 27) and cfg.mask_token_id == 2 and cfg.gamma == 7
    assert (cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.head_dim) == (576, 49152, 9, 64)
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError):
        DrafterConfig.from_dict({**cfg.to_dict(), "bogus": 1})
