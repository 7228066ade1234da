"""Build the device inputs of a forward from host-known sizes, without reading anything back.

Per-request values become per-token values with `repeat_interleave(..., output_size=T)`
(T is a host int), gathers and broadcasts. Dropping `output_size` makes PyTorch read the
total back from the device and wait for all queued work (docs/design.md §4); the switch exists
only so a benchmark can measure that cost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from engine.kernels.attention_metadata import AttentionMetadata, SharedPrefix
from engine.runner.h2d import to_device


@dataclass(frozen=True)
class ExtendInputs:
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata


def expand_extend(
    req_to_token: torch.Tensor,
    rows: np.ndarray,
    prefix_lens: np.ndarray,
    extend_lens: np.ndarray,
    device: torch.device,
    *,
    causal: bool = True,
    host_sized_expansion: bool = True,
    shared: SharedPrefix | None = None,
) -> ExtendInputs:
    """Ragged extend (prefill chunks): request b computes positions
    [prefix_lens[b], prefix_lens[b] + extend_lens[b])."""
    num_reqs = len(rows)
    num_tokens = int(extend_lens.sum())
    q_start_host = (np.cumsum(extend_lens) - extend_lens).astype(np.int32)
    rows_d = to_device(rows.astype(np.int64), device)
    prefix_d = to_device(prefix_lens.astype(np.int32), device)
    extend_d = to_device(extend_lens.astype(np.int32), device)
    q_start_d = to_device(q_start_host, device)
    request_ids = torch.arange(num_reqs, device=device)
    if host_sized_expansion:
        token_req = torch.repeat_interleave(request_ids, extend_d, output_size=num_tokens)
    else:
        token_req = torch.repeat_interleave(request_ids, extend_d)
    token_offset = torch.arange(num_tokens, device=device) - q_start_d[token_req]
    positions = prefix_d[token_req].to(torch.int64) + token_offset
    out_slots = req_to_token[rows_d[token_req], positions].to(torch.int64)
    meta = AttentionMetadata(
        req_to_token=req_to_token,
        req_rows=rows_d,
        seq_lens=prefix_d + extend_d,
        extend_lens=extend_d,
        q_start=q_start_d,
        out_slots=out_slots,
        token_req=token_req,
        token_offset=token_offset,
        num_tokens=num_tokens,
        max_extend_len=int(extend_lens.max()),
        max_seq_len=int((prefix_lens + extend_lens).max()),
        causal=causal,
        shared=shared,
    )
    return ExtendInputs(positions=positions, meta=meta)


def uniform_window(
    req_to_token: torch.Tensor,
    rows_d: torch.Tensor,
    start_d: torch.Tensor,
    width: int,
    max_seq_len: int,
    *,
    causal: bool,
    shared: SharedPrefix | None = None,
) -> ExtendInputs:
    """Every request computes `width` tokens at positions start[b] + [0, width): decode
    (width 1), the DSpark drafter block (gamma, non-causal) and verify window (W, causal).
    `start_d` may live only on the device; `max_seq_len` is the host's upper bound."""
    num_reqs = rows_d.shape[0]
    device = rows_d.device
    offsets = torch.arange(width, device=device)
    positions_2d = start_d.to(torch.int64)[:, None] + offsets  # [B, width]
    out_slots = req_to_token[rows_d[:, None], positions_2d].to(torch.int64)  # [B, width]
    extend = torch.full((num_reqs,), width, dtype=torch.int32, device=device)
    meta = AttentionMetadata(
        req_to_token=req_to_token,
        req_rows=rows_d,
        seq_lens=start_d.to(torch.int32) + width,
        extend_lens=extend,
        q_start=torch.arange(num_reqs, device=device, dtype=torch.int32) * width,
        out_slots=out_slots.reshape(-1),
        token_req=torch.arange(num_reqs, device=device).repeat_interleave(width, output_size=num_reqs * width),
        token_offset=offsets.repeat(num_reqs),
        num_tokens=num_reqs * width,
        max_extend_len=width,
        max_seq_len=max_seq_len,
        causal=causal,
        uniform_extend=width,
        shared=shared,
    )
    return ExtendInputs(positions=positions_2d.reshape(-1), meta=meta)


def concat_extend(first: ExtendInputs, second: ExtendInputs, shared: SharedPrefix | None = None) -> ExtendInputs:
    """One ragged forward of `first`'s requests then `second`'s (a mixed step: the decode
    rows' windows, then the prefill chunks). Both must be causal; bounds stay host ints.
    `shared`: keys the requests of both read through the same slots, in that order."""
    a, b = first.meta, second.meta
    assert a.causal and b.causal, "a mixed forward is causal"
    if shared is not None:
        a = dataclasses.replace(a, shared=shared.rows(0, a.batch_size))
        b = dataclasses.replace(b, shared=shared.rows(a.batch_size, a.batch_size + b.batch_size))
    meta = AttentionMetadata(
        req_to_token=a.req_to_token,
        req_rows=torch.cat((a.req_rows, b.req_rows)),
        seq_lens=torch.cat((a.seq_lens.to(torch.int32), b.seq_lens.to(torch.int32))),
        extend_lens=torch.cat((a.extend_lens, b.extend_lens)),
        q_start=torch.cat((a.q_start, b.q_start + a.num_tokens)),
        out_slots=torch.cat((a.out_slots, b.out_slots)),
        token_req=torch.cat((a.token_req, b.token_req + a.batch_size)),
        token_offset=torch.cat((a.token_offset, b.token_offset)),
        num_tokens=a.num_tokens + b.num_tokens,
        max_extend_len=max(a.max_extend_len, b.max_extend_len),
        max_seq_len=max(a.max_seq_len, b.max_seq_len),
        causal=True,
        parts=(a, b),
        shared=shared,
    )
    return ExtendInputs(positions=torch.cat((first.positions, second.positions)), meta=meta)
