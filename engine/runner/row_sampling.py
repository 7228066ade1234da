"""Sampling state kept per request row on the device, and the runner's sampling calls.

Each request's parameters are staged once, at admission, into per-row tables
(`SamplingTensors.empty` + `write_rows`, and `LogitBiasTable` for `logit_bias`); a step
gathers its rows on the device, so steady decoding copies nothing from the host but the
row ids. Only host-known batch facts (`SamplingFlags`, the batch's logit-bias width) choose
code paths and shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.request import Request
from engine.runner.grammar_rows import GrammarRows, HostGrammarRows
from engine.runner.h2d import to_device
from engine.runner.step_output import StepLogprobs
from engine.sampling.logit_bias import LogitBiasTable, batch_bias_width
from engine.sampling.logprobs import TokenLogprobs, compute_logprobs
from engine.sampling.penalties import PenaltyState
from engine.sampling.sampler import Sampler, SamplingFlags, SamplingTensors, processed_logits, sampling_law
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class RowSample:
    tokens: torch.Tensor  # [R] int64
    logprobs: TokenLogprobs | None

    def step_logprobs(self, num_rows: int, picked: torch.Tensor | None) -> StepLogprobs | None:
        """Logprobs laid out [num_rows, 1, ...]; `picked` scatters the R sampled rows into
        their batch rows (None: R == num_rows, in order)."""
        if self.logprobs is None:
            return None
        lp = self.logprobs
        if picked is None:
            return StepLogprobs(lp.chosen[:, None], lp.top_ids[:, None], lp.top_logprobs[:, None])
        chosen = lp.chosen.new_zeros((num_rows, 1))
        chosen[picked, 0] = lp.chosen
        top_ids = lp.top_ids.new_zeros((num_rows, 1, lp.top_ids.shape[-1]))
        top_ids[picked, 0] = lp.top_ids
        top_lps = lp.top_logprobs.new_zeros((num_rows, 1, lp.top_logprobs.shape[-1]))
        top_lps[picked, 0] = lp.top_logprobs
        return StepLogprobs(chosen, top_ids, top_lps)


class RowSampling:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.table = SamplingTensors.empty(max_rows, device, vocab_size=vocab_size)
        self.penalties = PenaltyState(max_rows, vocab_size, device)
        self.logit_bias = LogitBiasTable(max_rows, vocab_size, device)
        self.sampler = Sampler()

    def set_row(self, row: int, params: SamplingParams, key: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        values = SamplingTensors.from_params([params], [key], self.device, vocab_size=self.vocab_size)
        row_d = to_device(np.array([row], dtype=np.int64), self.device)
        self.table.write_rows(row_d, values)
        self.logit_bias.set_row(row, params.logit_bias, row_d)
        if params.uses_penalties:
            self.penalties.reset(row, prompt_ids, output_ids)

    def batch(self, rows_d: torch.Tensor, reqs: list[Request]) -> SamplingTensors:
        params = [r.params for r in reqs]
        st = self.table.gather(rows_d, SamplingFlags.from_params(params, self.vocab_size))
        return st.with_logit_bias(self.logit_bias.gather(rows_d, batch_bias_width(params)))

    def sample(
        self,
        logits: torch.Tensor,
        rows_d: torch.Tensor,
        counters: torch.Tensor,
        reqs: list[Request],
        grammar: GrammarRows | None = None,
    ) -> RowSample:
        """logits [R, V]; counters [R] int64: the position of the token being sampled. Rows of
        grammar requests sample under their grammar's mask for this position: `grammar`'s
        (a captured step's static buffers), else filled from `reqs` here."""
        if grammar is None:
            host = HostGrammarRows.fill(reqs, self.vocab_size)
            grammar = None if host is None else host.to_device(self.device)
        st = self.batch(rows_d, reqs)
        if grammar is not None:
            st = st.with_token_bitmask(grammar.token_bitmask)
        result = self.sampler.sample(logits, st, counters, self.penalties, rows_d)
        return RowSample(result.tokens, result.logprobs)

    def record_outputs(self, rows_d: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count committed tokens [B, n] (-1 padding) for the frequency/presence penalties."""
        self.penalties.update(rows_d, tokens)

    def temperature(self, rows_d: torch.Tensor) -> torch.Tensor:
        """[B] float32, 0 on greedy rows (the drafter's convention)."""
        temps = self.table.temperature.index_select(0, rows_d)
        return torch.where(self.table.greedy.index_select(0, rows_d), torch.zeros_like(temps), temps)

    def keys(self, rows_d: torch.Tensor) -> torch.Tensor:
        return self.table.key.index_select(0, rows_d)

    # -- DSpark verify window: W rows per request --------------------------------------------

    def _window(
        self, logits: torch.Tensor, rows_d: torch.Tensor, drafts: torch.Tensor, reqs: list[Request]
    ) -> tuple[torch.Tensor, SamplingTensors]:
        """Flatten [B, W, V] to [B*W, V] processed logits: every verify row gets its request's
        logit bias, and the penalties it would see: row j of a request has already generated
        d_0 .. d_{j-1} of its block."""
        batch, width, vocab = logits.shape
        rows_w = rows_d.repeat_interleave(width, output_size=batch * width)
        st_w = self.batch(rows_d, reqs).repeat_rows(width)
        extra_counts = None
        if st_w.flags.any_penalties and self.penalties.allocated:
            block_counts = torch.zeros((batch, width, vocab), dtype=torch.int32, device=logits.device)
            block_counts[:, 1:].scatter_(2, drafts[:, :, None], 1)
            block_counts = block_counts.cumsum(dim=1, dtype=torch.int32)  # [B, W, V]: d_0..d_{j-1}
            extra_counts = block_counts.view(batch * width, vocab)
        flat = logits.reshape(batch * width, vocab)
        return processed_logits(flat, st_w, self.penalties, rows_w, extra_counts), st_w

    def penalized(
        self, logits: torch.Tensor, rows_d: torch.Tensor, drafts: torch.Tensor, reqs: list[Request]
    ) -> torch.Tensor:
        """[B, W, V] logits after each verify row's logit bias and penalties (what greedy takes
        the argmax of)."""
        flat, _ = self._window(logits, rows_d, drafts, reqs)
        return flat.view(logits.shape)

    def target_probs(
        self, logits: torch.Tensor, rows_d: torch.Tensor, drafts: torch.Tensor, reqs: list[Request]
    ) -> torch.Tensor:
        """[B, W, V]: the exact law plain sampling would draw each verify row from."""
        flat, st_w = self._window(logits, rows_d, drafts, reqs)
        return sampling_law(flat, st_w).view(logits.shape)

    def window_logprobs(
        self, logits: torch.Tensor, out_tokens: torch.Tensor, reqs: list[Request]
    ) -> StepLogprobs | None:
        """Logprobs of the committed tokens [B, W] (-1 padding gets a dummy entry)."""
        requested = [r.params.logprobs for r in reqs if r.params.logprobs is not None]
        if not requested:
            return None
        batch, width, vocab = logits.shape
        lp = compute_logprobs(logits.reshape(batch * width, vocab), out_tokens.clamp(min=0).reshape(-1), max(requested))
        return StepLogprobs(
            lp.chosen.view(batch, width), lp.top_ids.view(batch, width, -1), lp.top_logprobs.view(batch, width, -1)
        )
