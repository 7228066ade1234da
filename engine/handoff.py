"""What a prefill engine hands a decode engine for one request (docs/design.md §5): the KV of
every computed position (target and draft pools, same slot order), the tokens so far and the
sampling state. Tensors are on the CPU here; a device-to-device transfer can move the same
fields between GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class KVHandoff:
    request_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]  # generated so far (the prefill's first token)
    params: SamplingParams
    rng_key: int
    kv_len: int  # positions with KV; the last output token is the next input
    target_kv: torch.Tensor  # [L, 2, kv_len, Hkv, D]
    draft_kv: torch.Tensor | None  # [Ld, 2, kv_len, Hkv_d, D_d] when DSpark is on
    arrival_s: float
    num_cached_tokens: int = 0

    @property
    def nbytes(self) -> int:
        n = self.target_kv.numel() * self.target_kv.element_size()
        if self.draft_kv is not None:
            n += self.draft_kv.numel() * self.draft_kv.element_size()
        return n


@dataclass(frozen=True)
class Continuation:
    """Where a request picks up when it starts on this engine (docs/design.md §5.6): its
    sampling key, and the tokens it already generated elsewhere (a request migrated off a
    worker that died or drained; empty for a new request). The engine prefills prompt +
    `output_ids`, replays their text through the stop-string matcher without emitting it, and
    samples on from the next position: with the same key the continuation is the one the
    first engine would have produced."""

    rng_key: int | None = None  # None: from the request's seed, or assigned by the engine
    output_ids: tuple[int, ...] = ()
