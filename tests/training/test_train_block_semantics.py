"""The dense training block forward is the inference block: for every anchor p it equals
inject_kv of the context [0, p) into the paged draft pool followed by propose with the torch
attention backend (docs/design.md §3), logits to 1e-4."""

from __future__ import annotations

import numpy as np
import torch
from train_helpers import tiny_drafter, tiny_drafter_config, tiny_target, tiny_target_config

from engine.attention.torch_backend import TorchAttentionBackend
from engine.kv.pool import KVPool
from engine.models.context import ForwardContext
from engine.runner.batch_inputs import uniform_window
from training.block import base_logits, draft_block_hidden, free_running_steps, teacher_forced_steps
from training.dense_attention import block_attention_mask
from training.evaluate import _walk
from training.teacher import run_teacher


def test_block_mask_sees_context_before_anchor_and_own_block() -> None:
    anchors = torch.tensor([[0, 3], [5, 2]])
    mask = block_attention_mask(anchors, context_len=6, gamma=2)[:, 0]  # [B, A*g, S + A*g]
    assert mask.shape == (2, 4, 10)
    # Row (b=0, a=1, j=0): context keys 0..2, block keys of anchor 1 (columns 8, 9).
    assert mask[0, 2].tolist() == [True, True, True, False, False, False, False, False, True, True]
    # Anchor at 0 sees no context, only its own block.
    assert mask[0, 0].tolist() == [False] * 6 + [True, True, False, False]
    assert mask[1, 1].tolist() == [True] * 5 + [False] + [True, True, False, False]


@torch.no_grad()
def test_dense_block_equals_paged_inference() -> None:
    target_config = tiny_target_config(num_layers=3)
    target = tiny_target(target_config, seed=1)
    config = tiny_drafter_config(target_config, gamma=5, num_layers=2, markov_rank=8)
    drafter = tiny_drafter(target, config, seed=2, random_norms=True).eval()
    gen = torch.Generator().manual_seed(3)
    batch, seq_len = 2, 20
    tokens = torch.randint(0, target_config.vocab_size, (batch, seq_len), generator=gen)
    lengths = torch.tensor([seq_len, 14])
    teacher = run_teacher(target, config.capture_layers, tokens, lengths)
    anchors = torch.tensor([[0, 1, 7, 19], [13, 4, 9, 2]])  # [B, A]; any order, p = 0 has no context
    hidden = draft_block_hidden(drafter, teacher.aux, tokens, anchors)  # [B, A, g, H]
    dense_base = base_logits(target.compute_logits, hidden)
    anchor_tokens = tokens.gather(1, anchors)
    dense = free_running_steps(drafter, dense_base.flatten(0, 1), anchor_tokens.flatten())

    # The engine's paged path: one request per (row, anchor), context [0, p) injected at the
    # request's own (shuffled) slots, then propose at seq_len = p.
    num_reqs = batch * anchors.shape[1]
    max_ctx = seq_len + config.gamma
    pool = KVPool(
        config.num_layers,
        num_reqs * max_ctx,
        config.num_kv_heads,
        config.head_dim,
        torch.float32,
        torch.device("cpu"),
    )
    pool.k.fill_(float("nan"))  # anything read that was not written shows up
    pool.v.fill_(float("nan"))
    req_to_token = torch.randperm(num_reqs * max_ctx, generator=gen).view(num_reqs, max_ctx).to(torch.int32)
    seq_lens = anchors.flatten()
    for r in range(num_reqs):
        b, p = divmod(r, anchors.shape[1])
        p = int(anchors[b, p])
        if p:
            drafter.inject_kv(teacher.aux[b, :p], torch.arange(p), req_to_token[r, :p].long(), pool)
    inputs = uniform_window(
        req_to_token,
        torch.arange(num_reqs),
        seq_lens,
        config.gamma,
        int(seq_lens.max()) + config.gamma,
        causal=False,
    )
    ctx = ForwardContext(meta=inputs.meta, kv=pool, backend=TorchAttentionBackend())
    zeros = torch.zeros(num_reqs)
    keys = torch.arange(num_reqs)
    proposal = drafter.propose(
        anchor_tokens.flatten(),
        ctx,
        inputs.positions.view(num_reqs, config.gamma),
        zeros,
        keys,
        keys,
        any_sampled=False,
    )
    torch.testing.assert_close(dense.step_logits, proposal.draft_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(dense.draft_tokens, proposal.draft_tokens)
    assert proposal.confidence is not None and drafter.confidence is not None
    dense_conf = drafter.confidence(hidden.flatten(0, 1), dense.prev_embed)
    torch.testing.assert_close(dense_conf, proposal.confidence, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_teacher_forcing_matches_free_running_on_its_own_path() -> None:
    """With prev = the drafter's own choices, the teacher-forced Markov step is the inference one."""
    target_config = tiny_target_config()
    target = tiny_target(target_config, seed=4)
    config = tiny_drafter_config(target_config, gamma=4)
    drafter = tiny_drafter(target, config, seed=5)
    tokens = torch.randint(0, target_config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    teacher = run_teacher(target, config.capture_layers, tokens, torch.tensor([12]))
    anchors = torch.tensor([[3, 8]])
    base = base_logits(target.compute_logits, draft_block_hidden(drafter, teacher.aux, tokens, anchors))
    free = free_running_steps(drafter, base.flatten(0, 1), tokens.gather(1, anchors).flatten())
    prev = torch.cat([tokens.gather(1, anchors).flatten()[:, None], free.draft_tokens[:, :-1]], dim=1)
    forced, _ = teacher_forced_steps(drafter, base.flatten(0, 1), prev)
    torch.testing.assert_close(forced, free.step_logits)


def test_greedy_walk_commits_accepted_drafts_plus_bonus() -> None:
    """Answer from position 2; gamma 3. The target's greedy path is the sequence itself."""
    tokens = np.array([9, 9, 10, 11, 12, 13, 14, 15, 16, 2])
    argmax = np.append(tokens[1:], 0)  # the target's greedy token after each position
    drafts = np.full((10, 3), -1)
    drafts[2] = [11, 12, 99]  # anchor 2: two accepted, bonus 13 -> next anchor at 5
    drafts[5] = [14, 15, 16]  # all three accepted -> next anchor at 9 (EOS) ends the walk
    assert _walk(drafts, argmax, tokens, prompt_len=2, length=10) == [2, 3]
    drafts[5] = [77, 15, 16]  # first draft wrong: nothing accepted, bonus 14, then anchors 6, 7, 8
    assert _walk(drafts, argmax, tokens, prompt_len=2, length=10) == [2, 0, 0, 0, 0]
    # Where the stored token is not the target's argmax, the greedy path beyond is unknown: stop there.
    # Here d_2 = 13 equals argmax[4], but argmax[4] follows the stored 12, not the greedy 50.
    argmax[3] = 50
    drafts[2] = [11, 50, 13]
    assert _walk(drafts, argmax, tokens, prompt_len=2, length=10) == [2, 0, 0, 0, 0]
