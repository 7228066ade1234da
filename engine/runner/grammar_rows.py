"""A decode step's grammar inputs (docs/design.md §2.8): each row's token bitmask for the
position it samples, and which rows have a grammar.

The host fills them at launch (each grammar request's matcher has accepted every committed
token: the scheduler lags it a step); rows without a grammar allow every token. A captured
step (§4.6) reads them from static buffers, so a batch with grammar rows replays its graph
like any other greedy batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.request import Request
from engine.runner.h2d import to_device
from engine.structured.matcher import bitmask_words

ALL_ALLOWED = -1  # an int32 word with every bit set


@dataclass(frozen=True)
class HostGrammarRows:
    token_bitmask: np.ndarray  # [B, words] int32
    is_grammar: np.ndarray  # [B] bool

    @classmethod
    def fill(cls, reqs: list[Request], vocab_size: int) -> HostGrammarRows | None:
        """The rows of `reqs`; None when no request has a grammar."""
        if not any(r.grammar is not None for r in reqs):
            return None
        bitmask = np.full((len(reqs), bitmask_words(vocab_size)), ALL_ALLOWED, dtype=np.int32)
        for i, req in enumerate(reqs):
            if req.grammar is not None:
                req.grammar.fill(bitmask, i)
        return cls(bitmask, np.array([r.grammar is not None for r in reqs]))

    def to_device(self, device: torch.device) -> GrammarRows:
        return GrammarRows(to_device(self.token_bitmask, device), to_device(self.is_grammar, device))


@dataclass(frozen=True)
class GrammarRows:
    token_bitmask: torch.Tensor  # [B, words] int32: bit t % 32 of word t // 32 allows token t
    is_grammar: torch.Tensor  # [B] bool

    @classmethod
    def all_allowed(cls, rows: int, vocab_size: int, device: torch.device) -> GrammarRows:
        bitmask = torch.full((rows, bitmask_words(vocab_size)), ALL_ALLOWED, dtype=torch.int32, device=device)
        return cls(bitmask, torch.zeros(rows, dtype=torch.bool, device=device))

    def __getitem__(self, rows: slice) -> GrammarRows:
        return GrammarRows(self.token_bitmask[rows], self.is_grammar[rows])
