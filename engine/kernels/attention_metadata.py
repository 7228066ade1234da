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

A forward may also name keys that several of its requests read through the same slots
(`shared`, a SharedPrefix): a backend may then attend those keys once for all of them and
the rest per request (docs/design.md §4.9). The answer is the same either way.

Build one per forward. On CPU the torch backend derives its gather ids and masks from a
metadata object at the first layer and reuses them for every later call with that same
object, so its tensors must not be rewritten in place meanwhile (CUDA graphs do rewrite
them between replays; off CPU the torch backend derives them on every call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SharedPrefix:
    """Keys [0, P) that the sharing requests of a forward read through the same slots (a
    shared system prompt held once by the prefix cache). For every request b with
    `lens[b] > 0`: `lens[b] == P`, P <= seq_lens[b] - extend_lens[b] (every row of b sees all
    of them), and `req_to_token[req_rows[b], :P] == req_to_token[table_row, :P]`."""

    lens: torch.Tensor  # [B] int32: P for a request that shares the keys, 0 for one that does not
    length: torch.Tensor  # [1] int32: P (0: nothing shared this time)
    table_row: torch.Tensor  # [1] int32: a req_to_token row whose first P entries are those slots
    max_length: int  # host upper bound on P: sizes the shared pass's grid

    def rows(self, start: int, end: int) -> SharedPrefix:
        """The same keys for requests [start, end) of the forward."""
        return SharedPrefix(self.lens[start:end], self.length, self.table_row, self.max_length)


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
    shared: SharedPrefix | None = None  # keys several requests read through the same slots

    @property
    def batch_size(self) -> int:
        return int(self.req_rows.shape[0])
