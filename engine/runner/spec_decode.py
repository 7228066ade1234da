"""One DSpark decode step, launched without a host wait (docs/design.md §3–§4).

Per request row: the anchor (last committed token) sits at position `seq_len`, both read
from per-row device buffers. The drafter proposes gamma tokens in one non-causal block
forward; the target verifies `[anchor, d_0 .. d_{gamma-1}]` (W = gamma + 1 tokens) in one
causal forward into the window `seq_len + [0, W)`, whose slots the host reserved ahead;
acceptance gives fixed-shape `out_tokens [B, W]` and `accept_len [B]`; the committed rows'
captured target hidden states are KV-injected into the draft pool (rejected columns: slot
-1); the bonus token and the new length go back into the per-row buffers.

Batches over `SpecSetup.max_batch_size` take the plain one-token step instead
(ModelRunner._plain_decode), which captures the drafter's layers and `inject`s the token's
KV, so the draft pool never misses a committed token and drafting resumes as soon as the
batch shrinks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.attention.backend import AttentionBackend
from engine.kernels.attention_metadata import SharedPrefix
from engine.kv.pool import KVPool
from engine.models.context import CausalLM, ForwardContext
from engine.request import Request
from engine.runner.batch_inputs import ExtendInputs, uniform_window
from engine.runner.grammar_rows import GrammarRows, HostGrammarRows
from engine.runner.options import AcceptRule
from engine.runner.row_sampling import RowSampling
from engine.runner.step_output import DeviceStepOutput
from engine.speculative import accept as acc
from engine.speculative.setup import SpecSetup


class Draft(NamedTuple):
    """A proposed block and the verify window that checks it (SpecDecoder.propose)."""

    rows_d: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int32: each row's committed KV length (device only)
    drafts: torch.Tensor  # [B, gamma] int64
    draft_logits: torch.Tensor  # the drafter's logits of the drafts
    temperature: torch.Tensor  # [B] float32, 0 on greedy rows
    keys: torch.Tensor  # [B]: the rows' sampling keys
    verify: ExtendInputs  # the window seq_len + [0, W) of every row, causal
    verify_ids: torch.Tensor  # [B*W] int64: anchor then drafts, row after row


class SpecDecoder:
    def __init__(
        self,
        setup: SpecSetup,
        model: CausalLM,
        target_pool: KVPool,
        draft_pool: KVPool,
        backend: AttentionBackend,
        sampling: RowSampling,
        accept_rule: AcceptRule | None = None,
    ) -> None:
        self.setup = setup
        self.model = model
        self.target_pool = target_pool
        self.draft_pool = draft_pool
        self.backend = backend
        self.sampling = sampling
        self.accept_rule = accept_rule  # RunnerOptions.accept_rule

    def inject(self, aux_hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Every new token of a forward that did not draft (prefill, or a decode step over the
        batch cap): its captured hidden state becomes draft context KV at its slot."""
        self.setup.drafter.inject_kv(aux_hidden, positions, slots, self.draft_pool)

    def step(
        self,
        rows_d: torch.Tensor,
        max_len: int,
        reqs: list[Request],
        req_to_token: torch.Tensor,
        last_token: torch.Tensor,
        kv_len: torch.Tensor,
        grammar: GrammarRows | None = None,
        shared: SharedPrefix | None = None,
    ) -> DeviceStepOutput:
        """Launch draft → verify → accept → commit for the rows `rows_d` [B]; returns the
        fixed-shape device outputs to copy to the host. `max_len` bounds every row's KV
        length (host, one step behind); `last_token` / `kv_len` are the per-row device
        buffers, updated in place. `reqs` carry the sampling facts the host knows; an empty
        list means greedy rows without penalties or logprobs (what a CUDA graph captures).
        `grammar`: the rows' grammar masks (a captured step's static buffers), else filled
        from `reqs`. `shared`: keys the rows read through the same slots (docs/design.md §4.9),
        in the draft pool as in the target's."""
        draft = self.propose(rows_d, max_len, reqs, req_to_token, last_token, kv_len, shared)
        capture = self.setup.capture_layers
        ctx = ForwardContext(draft.verify.meta, self.target_pool, self.backend, capture_layers=capture)
        hidden = self.model(draft.verify_ids, draft.verify.positions, ctx)  # [B*W, H]
        aux = ctx.aux_hidden()
        assert aux is not None  # the verify context captures the drafter's layers
        return self.commit(draft, hidden, aux, reqs, last_token, kv_len, grammar)

    def propose(
        self,
        rows_d: torch.Tensor,
        max_len: int,
        reqs: list[Request],
        req_to_token: torch.Tensor,
        last_token: torch.Tensor,
        kv_len: torch.Tensor,
        shared: SharedPrefix | None = None,
    ) -> Draft:
        """Draft gamma tokens per row and lay out the verify window the target runs next
        (alone, or ahead of prefill chunks in a mixed step)."""
        gamma, width = self.setup.gamma, self.setup.window
        batch = rows_d.shape[0]
        seq_lens = kv_len[rows_d]  # [B] int32, device only
        anchor = last_token[rows_d]  # [B]
        all_greedy = all(r.params.greedy for r in reqs)

        # 1. Draft: [anchor, mask x (gamma-1)] at seq_len + [0, gamma), non-causal.
        block = uniform_window(req_to_token, rows_d, seq_lens, gamma, max_len + gamma, causal=False, shared=shared)
        block_ctx = ForwardContext(block.meta, self.draft_pool, self.backend)
        temperature = self.sampling.temperature(rows_d)
        keys = self.sampling.keys(rows_d)
        proposal = self.setup.drafter.propose(
            anchor,
            block_ctx,
            block.positions.view(batch, gamma),
            temperature,
            keys,
            seq_lens.to(torch.int64) + 1,
            any_sampled=not all_greedy,
        )
        drafts = proposal.draft_tokens  # [B, gamma]
        # 2. The verify window: [anchor, drafts] at seq_len + [0, W), causal.
        verify = uniform_window(req_to_token, rows_d, seq_lens, width, max_len + width, causal=True, shared=shared)
        verify_ids = torch.cat((anchor[:, None], drafts), dim=1).reshape(-1)  # [B*W]
        return Draft(rows_d, seq_lens, drafts, proposal.draft_logits, temperature, keys, verify, verify_ids)

    def commit(
        self,
        draft: Draft,
        hidden: torch.Tensor,
        aux: torch.Tensor,
        reqs: list[Request],
        last_token: torch.Tensor,
        kv_len: torch.Tensor,
        grammar: GrammarRows | None = None,
    ) -> DeviceStepOutput:
        """Accept and commit after the target ran the verify window: `hidden` [B*W, H] and
        the captured `aux` [B*W, K*H] are the window's rows. `grammar`: the rows' masks (a
        captured step's static buffers), else filled from `reqs`."""
        gamma, width = self.setup.gamma, self.setup.window
        rows_d, seq_lens, drafts, verify = draft.rows_d, draft.seq_lens, draft.drafts, draft.verify
        batch = rows_d.shape[0]
        logits = self.model.compute_logits(hidden).view(batch, width, -1)  # [B, W, V]

        # 3. Accept. Row j predicts position seq_len + j + 1 (its sampling counter).
        counters = verify.positions.view(batch, width) + 1  # [B, W]
        if all(r.params.greedy for r in reqs):
            result = acc.accept_greedy(drafts, self.sampling.penalized(logits, rows_d, drafts, reqs))
        else:
            target_probs = self.sampling.target_probs(logits, rows_d, drafts, reqs)  # [B, W, V]
            draft_probs = acc.draft_probs(draft.draft_logits, draft.temperature)
            result = acc.accept(
                drafts,
                draft_probs,
                self.sampling.penalized(logits, rows_d, drafts, reqs),
                target_probs,
                draft.keys,
                counters[:, 0],
                draft.temperature <= 0,
            )
        out_tokens, accept_len = result.out_tokens, result.accept_len
        if grammar is None:
            host = HostGrammarRows.fill(reqs, self.sampling.vocab_size)
            grammar = None if host is None else host.to_device(rows_d.device)
        if grammar is not None:
            out_tokens, accept_len = self._grammar_rows_commit_one(
                logits, rows_d, counters, reqs, grammar, out_tokens, accept_len
            )
        if self.accept_rule is not None:
            out_tokens, accept_len = self.accept_rule(drafts, draft.keys, counters[:, 0])

        # 4. Commit: anchor + accepted drafts get draft KV; the bonus is the next anchor.
        window_slots = verify.meta.out_slots.view(batch, width)
        commit = acc.commit_slots(window_slots, accept_len)
        self.setup.drafter.inject_kv(aux, verify.positions, commit.reshape(-1), self.draft_pool)
        new_len = acc.finalize(accept_len, seq_lens)
        bonus = out_tokens.gather(1, (accept_len.long() - 1)[:, None]).squeeze(1)
        last_token[rows_d] = bonus
        kv_len[rows_d] = new_len
        self.sampling.record_outputs(rows_d, out_tokens)

        return DeviceStepOutput(
            tokens=out_tokens,
            accept_len=accept_len,
            kv_len=new_len,
            logprobs=self.sampling.window_logprobs(logits, out_tokens, reqs),
            draft_len=torch.full((batch,), gamma, dtype=torch.int32, device=rows_d.device),
        )

    def _grammar_rows_commit_one(
        self,
        logits: torch.Tensor,
        rows_d: torch.Tensor,
        counters: torch.Tensor,
        reqs: list[Request],
        grammar: GrammarRows,
        out_tokens: torch.Tensor,
        accept_len: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Grammar rows commit one token: the first verify position sampled under the row's
        mask, exactly as a plain decode step samples it (same law, same counter). The host
        knows a grammar's mask for that position only, so its drafts are not taken
        (docs/design.md §2.8); the other rows keep their acceptance."""
        first = self.sampling.sample(logits[:, 0], rows_d, counters[:, 0], reqs, grammar).tokens  # [B]
        forced = torch.full_like(out_tokens, -1)
        forced[:, 0] = first
        out_tokens = torch.where(grammar.is_grammar[:, None], forced, out_tokens)
        accept_len = torch.where(grammar.is_grammar, torch.ones_like(accept_len), accept_len)
        return out_tokens, accept_len
