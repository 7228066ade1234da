"""One request's place in its grammar (host only): which tokens may come next, advanced by
each committed token. docs/design.md §2.8 says when the engine fills and advances it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import xgrammar as xgr


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one row's token bitmask: bit `t % 32` of word `t // 32` allows token t."""
    return (vocab_size + 31) // 32


class RequestGrammar:
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(compiled)

    def accept(self, token_id: int) -> bool:
        """Advance by a committed token; False if the grammar forbids it (state unchanged)."""
        return bool(self._matcher.accept_token(token_id))

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (an int32 [rows, words] array)."""
        self._matcher.fill_next_token_bitmask(torch.from_numpy(bitmask), row)

    def has_next_token(self, vocab_size: int) -> bool:
        """Some token of the vocabulary may come next. False for a grammar that needs text no
        token can spell (a character whose bytes the vocabulary lacks): sampling under its
        empty mask would pick a token the grammar refuses."""
        bitmask = np.zeros((1, bitmask_words(vocab_size)), dtype=np.int32)
        self.fill(bitmask, 0)
        return bool(bitmask.any())

    @property
    def is_terminated(self) -> bool:
        """A stop token was accepted: nothing may follow."""
        return bool(self._matcher.is_terminated())
