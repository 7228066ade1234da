"""Per-row sampling parameters as device tensors, plus the host-known facts about a batch
that choose code paths and static shapes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.logit_bias import LogitBiasRows
from engine.sampling.staging import PinnedPool, upload
from engine.sampling_params import MAX_LOGPROBS, SamplingParams


@dataclass(frozen=True)
class RowParams:
    """One request's sampling parameters, normalised for the device (host side).

    Greedy rows (`SamplingParams.greedy`, or top_k == 1) keep temperature 1 and no filters:
    they take the argmax. top_k is 0 when off (<= 0, or >= the vocabulary).
    """

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float

    @classmethod
    def of(cls, params: SamplingParams, vocab_size: int) -> RowParams:
        greedy = params.greedy or params.top_k == 1
        top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        return cls(
            greedy=greedy,
            temperature=1.0 if greedy else params.temperature,
            top_k=0 if greedy else top_k,
            top_p=1.0 if greedy else params.top_p,
            min_p=0.0 if greedy else params.min_p,
            repetition_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
        )


@dataclass(frozen=True)
class SamplingFlags:
    """What the host knows about a batch. Each field may over-approximate (a flag set when
    no row needs it, max_top_k above every row's top_k): results stay exact, only slower."""

    all_greedy: bool = False
    any_greedy: bool = True
    # >= every row's top_k (0: no row uses top-k). It sizes torch.topk when top-p is off;
    # with any_top_p the full sort applies every row's own top_k, so the defaults hold for
    # any batch.
    max_top_k: int = 0
    all_top_k: bool = False  # every sampled (non-greedy) row has 0 < top_k <= max_top_k
    any_top_p: bool = True
    any_min_p: bool = True
    any_penalties: bool = True
    max_logprobs: int | None = MAX_LOGPROBS  # top-N logprobs to compute; None: none

    @classmethod
    def from_params(cls, params_list: Sequence[SamplingParams], vocab_size: int) -> SamplingFlags:
        rows = [RowParams.of(p, vocab_size) for p in params_list]
        sampled = [r for r in rows if not r.greedy]
        requested = [p.logprobs for p in params_list if p.logprobs is not None]
        return cls(
            all_greedy=not sampled,
            any_greedy=len(sampled) < len(rows),
            max_top_k=max((r.top_k for r in rows), default=0),
            all_top_k=bool(sampled) and all(r.top_k > 0 for r in sampled),
            any_top_p=any(r.top_p < 1.0 for r in rows),
            any_min_p=any(r.min_p > 0.0 for r in rows),
            any_penalties=any(p.uses_penalties for p in params_list),
            max_logprobs=max(requested) if requested else None,
        )

    @classmethod
    def conservative(cls, vocab_size: int) -> SamplingFlags:
        """Flags that hold for any batch: every path on, top-k bounded by the vocabulary."""
        return cls(max_top_k=vocab_size)


_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
# The [B] tensors of SamplingTensors: every field but `flags` and `logit_bias`.
_ROW_FIELDS = (*_FLOAT_FIELDS, "top_k", "key", "greedy")
_NEUTRAL_ROW = RowParams(
    greedy=True,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    repetition_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
)


@dataclass(frozen=True)
class SamplingTensors:
    """Device tensors, one entry per batch row. Build with `from_params` (host lists ->
    pinned -> non-blocking copies), or keep a persistent per-slot table (`empty`,
    `write_rows`) and index it by request rows on the device with `gather`. The logit-bias
    pairs have a width of their own, so a per-slot table keeps them apart
    (`logit_bias.LogitBiasTable`) and the batch gets them with `with_logit_bias`."""

    temperature: torch.Tensor  # [B] float32; 1 on greedy rows
    top_k: torch.Tensor  # [B] int64; 0 = off
    top_p: torch.Tensor  # [B] float32; 1 = off
    min_p: torch.Tensor  # [B] float32; 0 = off
    repetition_penalty: torch.Tensor  # [B] float32; 1 = off (HF, prompt + output tokens)
    frequency_penalty: torch.Tensor  # [B] float32; 0 = off (OpenAI, output tokens)
    presence_penalty: torch.Tensor  # [B] float32; 0 = off (OpenAI, output tokens)
    key: torch.Tensor  # [B] int64 Philox key (rng.request_key)
    greedy: torch.Tensor  # [B] bool
    flags: SamplingFlags
    logit_bias: LogitBiasRows | None = None  # [B, K] pairs; None: no row has a bias (host-known)
    # [B, ceil(V / 32)] int32 grammar masks (bit t % 32 of word t // 32 allows token t; all
    # ones on rows without a grammar); None: no row has a grammar (host-known)
    token_bitmask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.key.shape[0])

    @property
    def device(self) -> torch.device:
        return self.key.device

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[RowParams],
        keys: Sequence[int],
        device: torch.device | str,
        flags: SamplingFlags,
        pinned_pool: PinnedPool | None = None,
        logit_bias: LogitBiasRows | None = None,
    ) -> SamplingTensors:
        if len(rows) != len(keys):
            raise ValueError(f"{len(rows)} rows but {len(keys)} keys")
        device = torch.device(device)
        floats = torch.tensor(
            [[getattr(r, name) for r in rows] for name in _FLOAT_FIELDS], dtype=torch.float32
        ).reshape(len(_FLOAT_FIELDS), len(rows))
        ints = torch.tensor(
            [[r.top_k for r in rows], list(keys), [int(r.greedy) for r in rows]], dtype=torch.int64
        ).reshape(3, len(rows))
        floats = upload(floats, device, pinned_pool)  # [6, B]: two copies in all
        ints = upload(ints, device, pinned_pool)  # [3, B]
        named = dict(zip(_FLOAT_FIELDS, floats.unbind(0), strict=True))
        return cls(top_k=ints[0], key=ints[1], greedy=ints[2] != 0, flags=flags, logit_bias=logit_bias, **named)

    @classmethod
    def from_params(
        cls,
        params_list: Sequence[SamplingParams],
        keys: Sequence[int],
        device: torch.device | str,
        *,
        vocab_size: int,
        pinned_pool: PinnedPool | None = None,
    ) -> SamplingTensors:
        """`keys[i]` is request i's `rng.request_key(...)`; top_k is clamped to `vocab_size`."""
        rows = [RowParams.of(p, vocab_size) for p in params_list]
        flags = SamplingFlags.from_params(params_list, vocab_size)
        logit_bias = LogitBiasRows.from_params(params_list, torch.device(device), pinned_pool)
        return cls.from_rows(rows, keys, device, flags, pinned_pool, logit_bias)

    @classmethod
    def empty(cls, capacity: int, device: torch.device | str, *, vocab_size: int) -> SamplingTensors:
        """A per-slot table of `capacity` neutral (greedy) rows, with conservative flags."""
        return cls.from_rows(
            [_NEUTRAL_ROW] * capacity,
            [0] * capacity,
            torch.device(device),
            SamplingFlags.conservative(vocab_size),
        )

    def write_rows(self, rows: torch.Tensor, values: SamplingTensors) -> None:
        """Table update on the device: row rows[i] of self <- row i of `values` (all but the
        logit-bias pairs, which a per-slot table keeps apart)."""
        for name in _ROW_FIELDS:
            getattr(self, name).index_copy_(0, rows, getattr(values, name))

    def gather(self, rows: torch.Tensor, flags: SamplingFlags | None = None) -> SamplingTensors:
        """Rows `rows` [B'] (int64, device) of this table as a batch. Pass the batch's own
        `flags` (`SamplingFlags.from_params` over its requests) to take the fast paths;
        without them the table's flags (conservative for `empty`) are kept."""
        picked = {name: getattr(self, name).index_select(0, rows) for name in _ROW_FIELDS}
        return SamplingTensors(
            flags=self.flags if flags is None else flags,
            logit_bias=None if self.logit_bias is None else self.logit_bias.index_select(rows),
            **picked,
        )

    def repeat_rows(self, times: int) -> SamplingTensors:
        """Each row `times` times in a row ([B*times]): the W rows of a DSpark verify window."""
        size = self.batch_size * times
        repeated = {name: getattr(self, name).repeat_interleave(times, output_size=size) for name in _ROW_FIELDS}
        return SamplingTensors(
            flags=self.flags,
            logit_bias=None if self.logit_bias is None else self.logit_bias.repeat_rows(times),
            **repeated,
        )

    def with_logit_bias(self, logit_bias: LogitBiasRows | None) -> SamplingTensors:
        """The same batch with these logit-bias pairs ([B, K], or None for no bias)."""
        return dataclasses.replace(self, logit_bias=logit_bias)

    def with_token_bitmask(self, token_bitmask: torch.Tensor | None) -> SamplingTensors:
        """The same batch under these grammar masks ([B, words] int32, or None for none)."""
        return dataclasses.replace(self, token_bitmask=token_bitmask)
