"""Padded training batches from a SequenceSet, in a deterministic, resumable order.

Each epoch is a seeded permutation of the sequences, cut into groups of `bucket_batches`
batches that are sorted by length inside the group (so rows of one batch have similar
lengths and little padding), and the batches are shuffled. The sampler's state is (epoch,
batch index): restoring it replays exactly the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from training.data import SequenceSet

PAD_ID = 0  # any id: padding sits after each row's last real token and is never attended or labelled


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, S] int64, right-padded
    lengths: torch.Tensor  # [B] int64: real tokens per row
    prompt_lens: torch.Tensor  # [B] int64: first answer position (0 for corpus text)
    from_target: torch.Tensor  # [B] bool: the tokens are the target's own output
    temperatures: torch.Tensor  # [B] float32


def pad_batch(
    sequences: SequenceSet,
    indices: np.ndarray,
    device: torch.device,
    max_seq_len: int,
    pad_multiple: int = 32,
) -> Batch:
    """Rows `indices` of `sequences`, truncated to max_seq_len, right-padded to a multiple of
    pad_multiple (fewer distinct shapes)."""
    lengths = np.minimum(sequences.lengths[indices], max_seq_len)
    seq_len = int(-(-int(lengths.max()) // pad_multiple) * pad_multiple)
    tokens = np.full((len(indices), seq_len), PAD_ID, dtype=np.int64)
    for row, (i, n) in enumerate(zip(indices, lengths, strict=True)):
        tokens[row, :n] = sequences.sequence(int(i))[:n]
    temps = sequences.temperatures[indices]
    return Batch(
        tokens=torch.from_numpy(tokens).to(device),
        lengths=torch.from_numpy(lengths.astype(np.int64)).to(device),
        prompt_lens=torch.from_numpy(sequences.prompt_lens[indices].astype(np.int64)).to(device),
        from_target=torch.from_numpy(temps >= 0).to(device),
        temperatures=torch.from_numpy(temps.astype(np.float32)).to(device),
    )


def trainable(sequences: SequenceSet, max_seq_len: int) -> np.ndarray:
    """Indices of the sequences with at least one anchor that has a label: an answer token at
    or after max(prompt_len, 1) that is followed by another token, within max_seq_len."""
    first_anchor = np.maximum(sequences.prompt_lens, 1)
    return np.flatnonzero(np.minimum(sequences.lengths, max_seq_len) - 2 >= first_anchor)


class BatchSampler:
    def __init__(
        self, sequences: SequenceSet, batch_size: int, max_seq_len: int, seed: int, bucket_batches: int = 16
    ) -> None:
        self.sequences = sequences
        self.indices = trainable(sequences, max_seq_len)
        if len(self.indices) == 0:
            raise ValueError("no training sequence has an answer token to learn from")
        self.batch_size = min(batch_size, len(self.indices))
        self.max_seq_len = max_seq_len
        self.seed = seed
        self.bucket_batches = bucket_batches
        self.epoch = 0
        self.cursor = 0
        self._batches = self._epoch_batches(0)

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        order = self.indices[rng.permutation(len(self.indices))]
        lengths = self.sequences.lengths
        group = self.batch_size * self.bucket_batches
        batches: list[np.ndarray] = []
        for g in range(0, len(order), group):
            chunk = order[g : g + group]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches.extend(
                chunk[b : b + self.batch_size]
                for b in range(0, len(chunk), self.batch_size)
                if len(chunk[b : b + self.batch_size]) == self.batch_size
            )
        if not batches:  # fewer sequences than one group: one short batch
            batches = [order[: self.batch_size]]
        return [batches[i] for i in rng.permutation(len(batches))]

    def next_indices(self) -> np.ndarray:
        if self.cursor >= len(self._batches):
            self.epoch += 1
            self.cursor = 0
            self._batches = self._epoch_batches(self.epoch)
        batch = self._batches[self.cursor]
        self.cursor += 1
        return batch

    def next_batch(self, device: torch.device) -> Batch:
        return pad_batch(self.sequences, self.next_indices(), device, self.max_seq_len)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._batches = self._epoch_batches(self.epoch)
