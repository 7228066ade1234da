"""Repetition (Hugging Face) and frequency/presence (OpenAI) penalties, per request row.

- repetition_penalty r, over prompt and output tokens (HF RepetitionPenaltyLogitsProcessor):
  a seen token's logit l becomes l / r if l > 0 else l * r.
- frequency f and presence s, over output tokens only (OpenAI):
  l -= f * count + s * (count > 0).
Repetition is applied first, as vLLM does.

The state lives on the device, one row per request row (the runner's slot): prompt-token
presence and output-token counts, `max_rows x vocab` each. It is allocated on the first
`reset`, which the host calls only for requests that use penalties, so a server whose
requests never use them pays nothing. Rows of other requests may hold stale counts; their
penalties are neutral, so `apply` leaves them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling.staging import PinnedPool, upload
from engine.sampling.tensors import SamplingTensors


class PenaltyState:
    def __init__(self, max_rows: int, vocab: int, device: torch.device | str) -> None:
        if max_rows < 1 or vocab < 1:
            raise ValueError(f"max_rows and vocab must be positive, got {max_rows} and {vocab}")
        self.max_rows = max_rows
        self.vocab = vocab
        self.device = torch.device(device)
        self.prompt_seen: torch.Tensor | None = None  # [max_rows, V] bool
        self.output_counts: torch.Tensor | None = None  # [max_rows, V] int32

    @property
    def allocated(self) -> bool:
        return self.output_counts is not None

    def _allocate(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prompt_seen is None or self.output_counts is None:
            shape = (self.max_rows, self.vocab)
            self.prompt_seen = torch.zeros(shape, dtype=torch.bool, device=self.device)
            self.output_counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
        return self.prompt_seen, self.output_counts

    def reset(
        self,
        row: int,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int] = (),
        pinned_pool: PinnedPool | None = None,
    ) -> None:
        """Host side, at admission of a request that uses penalties: forget the row's old
        request and record the new one's prompt (and, when a preempted request resumes,
        the tokens it has already generated). Non-blocking copies only."""
        if not 0 <= row < self.max_rows:
            raise ValueError(f"row {row} out of range [0, {self.max_rows})")
        for name, host_list in (("prompt_ids", prompt_ids), ("output_ids", output_ids)):
            if host_list and not 0 <= min(host_list) <= max(host_list) < self.vocab:
                raise ValueError(f"{name} must lie in [0, {self.vocab}), got min {min(host_list)} max {max(host_list)}")
        prompt_seen, output_counts = self._allocate()
        prompt_seen[row].zero_()
        output_counts[row].zero_()
        if not prompt_ids and not output_ids:
            return
        host_ids = torch.tensor([*prompt_ids, *output_ids], dtype=torch.int64)
        ids = upload(host_ids, self.device, pinned_pool)
        prompt_seen[row].index_fill_(0, ids[: len(prompt_ids)], True)
        generated = ids[len(prompt_ids) :]
        output_counts[row].scatter_add_(0, generated, torch.ones_like(generated, dtype=torch.int32))

    def update(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count newly committed tokens: `rows` [B] int64 (-1: padding row), `tokens` [B, n]
        int64 with -1 padding. Fixed shape; padded entries add 0."""
        if self.output_counts is None:
            return
        rows = rows.to(torch.int64)
        tokens = tokens.to(torch.int64).reshape(rows.shape[0], -1)
        valid = (tokens >= 0) & (rows[:, None] >= 0)  # [B, n]
        flat = rows.clamp(min=0)[:, None] * self.vocab + tokens.clamp(min=0)  # [B, n]
        self.output_counts.view(-1).scatter_add_(0, flat.reshape(-1), valid.reshape(-1).to(torch.int32))

    def apply(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        st: SamplingTensors,
        extra_counts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, V] penalised copy of float32 `logits`; `rows` [B] int64 are the batch rows'
        rows here (-1: padding, left unpenalised). `extra_counts` [B, V] int32 adds tokens
        not yet committed, e.g. draft tokens d_0..d_{j-1} before verify row j."""
        if self.prompt_seen is None or self.output_counts is None:
            return logits
        safe_rows = rows.to(torch.int64).clamp(min=0)
        counts = self.output_counts.index_select(0, safe_rows)  # [B, V] int32
        if extra_counts is not None:
            counts = counts + extra_counts
        generated = counts > 0
        real_row = (rows >= 0)[:, None]
        seen = (self.prompt_seen.index_select(0, safe_rows) | generated) & real_row
        repetition = st.repetition_penalty[:, None]
        repeated = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, repeated, logits)
        frequency = st.frequency_penalty[:, None] * counts.to(logits.dtype)
        presence = st.presence_penalty[:, None] * generated.to(logits.dtype)
        return logits - (frequency + presence) * real_row.to(logits.dtype)
