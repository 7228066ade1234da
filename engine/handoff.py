"""What a prefill engine hands a decode engine for one request (docs/design.md §5): the KV of
every computed position (target and draft pools, same slot order), the tokens so far and the
sampling state. `KVHandoff` carries the KV as tensors (CPU for the object store, or on the
decode worker's device after a device-to-device copy); `HeldKV` leaves it where it is, in the
prefill engine's pools at `slots`, which that engine keeps until the receiver has copied
them (docs/design.md §5.7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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
class HeldKV:
    """A handed-off request whose KV stays in the prefill engine's pools until released:
    the fields of `KVHandoff` but the tensors, and the pool slots of positions [0, kv_len)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    params: SamplingParams
    rng_key: int
    kv_len: int
    slots: np.ndarray  # [kv_len] int64, the same ids in the target and the draft pool
    arrival_s: float
    num_cached_tokens: int = 0

    def with_kv(self, target_kv: torch.Tensor, draft_kv: torch.Tensor | None) -> KVHandoff:
        """The hand-off once the KV has been copied out of the slots."""
        return KVHandoff(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            output_ids=self.output_ids,
            params=self.params,
            rng_key=self.rng_key,
            kv_len=self.kv_len,
            target_kv=target_kv,
            draft_kv=draft_kv,
            arrival_s=self.arrival_s,
            num_cached_tokens=self.num_cached_tokens,
        )


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
