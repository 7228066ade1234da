"""Training sequences and their on-disk shards.

A sequence is prompt + answer token ids. Its `temperature` says where the tokens came from:
0 for the target's greedy answer, > 0 for an answer it sampled at that temperature, -1 for
text that is not the target's output (an offline corpus). `heldout` marks sequences kept for
evaluation (by a hash of the prompt: training.prompts.heldout_by_hash).

Shards are safetensors files of numpy arrays (flat int32 tokens + offsets), written
atomically (temporary file + rename), so a run stopped at any point resumes at the first
shard that is missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from safetensors.numpy import load_file, save_file

from training.prompts import heldout_by_hash

NOT_TARGET_OUTPUT = -1.0  # temperature of corpus text
SHARD_SUFFIX = ".safetensors"


class ChatTokenizer(Protocol):
    """What the data pipeline needs of a tokenizer (engine.loader.tokenizer.Tokenizer has it)."""

    eos_token_ids: tuple[int, ...]

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@dataclass
class SequenceSet:
    tokens: np.ndarray  # [total] int32, the sequences back to back
    offsets: np.ndarray  # [n + 1] int64: sequence i is tokens[offsets[i]:offsets[i+1]]
    prompt_lens: np.ndarray  # [n] int32: tokens of the prompt (0 for corpus text)
    temperatures: np.ndarray  # [n] float32: 0 greedy, > 0 sampled, -1 not the target's output
    heldout: np.ndarray  # [n] bool

    def __len__(self) -> int:
        return int(self.prompt_lens.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def subset(self, indices: np.ndarray) -> SequenceSet:
        indices = np.asarray(indices, dtype=np.int64)
        return SequenceSet.from_lists(
            [self.sequence(int(i)) for i in indices],
            self.prompt_lens[indices],
            self.temperatures[indices],
            self.heldout[indices],
        )

    def split(self, heldout: bool) -> SequenceSet:
        return self.subset(np.flatnonzero(self.heldout == heldout))

    @classmethod
    def from_lists(
        cls,
        sequences: Sequence[Sequence[int] | np.ndarray],
        prompt_lens: Sequence[int] | np.ndarray,
        temperatures: Sequence[float] | np.ndarray,
        heldout: Sequence[bool] | np.ndarray,
    ) -> SequenceSet:
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = (
            np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
            if len(sequences)
            else np.zeros(0, dtype=np.int32)
        )
        return cls(
            tokens,
            offsets,
            np.asarray(prompt_lens, dtype=np.int32),
            np.asarray(temperatures, dtype=np.float32),
            np.asarray(heldout, dtype=bool),
        )

    @classmethod
    def concat(cls, parts: Sequence[SequenceSet]) -> SequenceSet:
        if not parts:
            return cls.from_lists([], [], [], [])
        offsets = [parts[0].offsets]
        base = parts[0].offsets[-1]
        for part in parts[1:]:
            offsets.append(part.offsets[1:] + base)
            base += part.offsets[-1]
        return cls(
            np.concatenate([p.tokens for p in parts]),
            np.concatenate(offsets),
            np.concatenate([p.prompt_lens for p in parts]),
            np.concatenate([p.temperatures for p in parts]),
            np.concatenate([p.heldout for p in parts]),
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "tokens": self.tokens,
            "offsets": self.offsets,
            "prompt_lens": self.prompt_lens,
            "temperatures": self.temperatures,
            "heldout": self.heldout.astype(np.uint8),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> SequenceSet:
        return cls(
            arrays["tokens"].astype(np.int32),
            arrays["offsets"].astype(np.int64),
            arrays["prompt_lens"].astype(np.int32),
            arrays["temperatures"].astype(np.float32),
            arrays["heldout"].astype(bool),
        )


class ShardStore:
    """A directory of sequence shards plus `meta.json`, the settings that produced them."""

    META_FILE = "meta.json"

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path(self, name: str) -> Path:
        return self.directory / f"{name}{SHARD_SUFFIX}"

    def has(self, name: str) -> bool:
        return self.path(name).is_file()

    def names(self, prefix: str = "") -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.name[: -len(SHARD_SUFFIX)] for p in self.directory.glob(f"{prefix}*{SHARD_SUFFIX}"))

    def write(self, name: str, sequences: SequenceSet) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(name)
        tmp = path.with_name(path.name + ".tmp")
        save_file(sequences.to_arrays(), str(tmp))
        os.replace(tmp, path)
        return path

    def read(self, name: str) -> SequenceSet:
        return SequenceSet.from_arrays(load_file(str(self.path(name))))

    def load_all(self) -> SequenceSet:
        return SequenceSet.concat([self.read(name) for name in self.names()])

    def check_meta(self, meta: dict[str, Any]) -> None:
        """Record `meta` for a new store; for an existing one, refuse settings that differ
        (mixing shards of two settings would silently train on both)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / self.META_FILE
        if path.is_file():
            recorded = json.loads(path.read_text())
            if recorded != json.loads(json.dumps(meta)):
                changed = sorted(k for k in set(recorded) | set(meta) if recorded.get(k) != meta.get(k))
                raise ValueError(
                    f"{self.directory} holds data generated with other settings ({', '.join(changed)} "
                    "differ); use another data directory or delete this one"
                )
            return
        path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def corpus_sequences(
    path: str | Path,
    tokenizer: ChatTokenizer,
    seq_len: int,
    heldout_permille: int,
    max_tokens: int | None = None,
) -> SequenceSet:
    """Cut a plain-text file into sequences of `seq_len` tokens (paragraphs joined, each window
    starting at a fresh tokenisation boundary). Marked as not the target's output."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    windows: list[list[int]] = []
    current: list[int] = []
    total = 0
    for paragraph in paragraphs:
        current.extend(tokenizer.encode(paragraph + "\n\n", add_special_tokens=False))
        while len(current) >= seq_len:
            windows.append(current[:seq_len])
            current = current[seq_len:]
            total += seq_len
        if max_tokens is not None and total >= max_tokens:
            break
    if len(current) > seq_len // 4:
        windows.append(current)
    heldout = [heldout_by_hash(" ".join(map(str, w[:32])), heldout_permille) for w in windows]
    return SequenceSet.from_lists(windows, [0] * len(windows), [NOT_TARGET_OUTPUT] * len(windows), heldout)
