"""What one forward tells the attention backend and every attention kernel it runs: the
kernels' input contract (engine.kernels.attention, triton/, cpu/attention.py read it).

Every forward is a batch of B requests; request b brings `extend_lens[b]` new query tokens
at positions `seq_lens[b] - extend_lens[b] ... seq_lens[b] - 1`. Decode is extend 1, DSpark
verify is extend W, the drafter block is extend gamma (non-causal), prefill is ragged.

Queries are flat `[T, Hq, D]`; request b's queries are rows `q_start[b] ... q_start[b] +
extend_lens[b] - 1`. Keys/values of the new tokens are first written into the paged cache at
`out_slots` (slot -1: skip), then every query attends to its request's keys through
`req_to_token[req_rows[b], 0:seq_lens[b]]`:

- causal: query j of request b sees keys `[0, seq_lens[b] - extend_lens[b] + j]`;
- non-causal (drafter block): every query of request b sees keys `[0, seq_lens[b])`.

Device tensors may be one step ahead of the host: the host only promises upper bounds
(`max_seq_len`, `max_extend_len`), which size grids and padded gathers. Nothing here may be
read back to the host.

Build one per forward. On CPU the torch backend derives its gather ids and masks from a
metadata object at the first layer and reuses them for every later call with that same
object, so its tensors must not be rewritten in place meanwhile (CUDA graphs do rewrite
them between replays; off CPU the torch backend derives them on every call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    req_to_token: torch.Tensor  # [max_reqs, max_ctx] int32: slot id of each request position
    req_rows: torch.Tensor  # [B] int64: row of each request in req_to_token
    seq_lens: torch.Tensor  # [B] int32: kv length after this forward (prefix + extend)
    extend_lens: torch.Tensor  # [B] int32: new query tokens of each request
    q_start: torch.Tensor  # [B] int32: first query row of each request in [T]
    out_slots: torch.Tensor  # [T] int64: where each new token's K/V goes; -1 skips the write
    token_req: torch.Tensor  # [T] int64: request index b of each query row
    token_offset: torch.Tensor  # [T] int64: j, the query's index inside its request's extend
    num_tokens: int  # T (host)
    max_extend_len: int  # host upper bound on extend_lens
    max_seq_len: int  # host upper bound on seq_lens
    causal: bool = True
    uniform_extend: int | None = None  # every request has exactly this many rows, laid [B, n]
    # A mixed step's forward (decode rows first, then prefill chunks) also keeps its two halves
    # as forwards of their own: parts[0] over query rows [0, n), parts[1] over rows [n, T) with
    # its q_start counted from n, where n = parts[0].num_tokens. A backend may attend them apart,
    # each with the kernel made for it; the whole (above) stays valid for one that does not.
    parts: tuple[AttentionMetadata, AttentionMetadata] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.req_rows.shape[0])
