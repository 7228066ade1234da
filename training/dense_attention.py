"""Dense attention backends for offline work: training, evaluation and reference generation.

They implement the engine's `AttentionBackend` signature (engine.models.context), so the
target (`LlamaForCausalLM.forward`) and the drafter (`DSparkDrafter.forward`) run through them
unchanged, but they lay tokens out densely instead of through the paged pool:

- `CausalRowsAttention`: the target over `[B, S]` right-padded rows, causal, no cache. Padding
  sits after each row's last real token, so causality alone keeps it out of real rows.
- `DraftBlockAttention`: DSpark blocks for many anchors per row at once. The "cache" handed
  in by `ctx.kv.layer(i)` is that layer's context K/V `[B, S, Hkv, D]` (differentiable,
  from `DSparkDrafter.context_kv`). The block of anchor a (rows `[B, A*gamma]`) sees context
  keys at positions `< anchors[b, a]` plus its own gamma block keys, non-causally: exactly
  what inference gives the block at `seq_len = anchors[b, a]` (draft KV exists for
  `[0, seq_len)`; the anchor's own context KV is injected only after its verify).
- `StaticCacheAttention`: batched sampling with a contiguous per-row cache `[B, Lmax]`.

The dense backends read their layout from their own fields; `ForwardContext.meta` only has
to describe the forward's shape (`dense_metadata`), nothing reads its slot tables.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.attention_metadata import AttentionMetadata


def _written(attn: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The backend contract's `out`: when given, the result is written there and returned."""
    if out is None:
        return attn
    out.copy_(attn)
    return out


def dense_metadata(num_rows: int, row_len: int, device: torch.device, causal: bool = True) -> AttentionMetadata:
    """Metadata of `num_rows` fresh requests of `row_len` tokens each, laid `[num_rows, row_len]`,
    with no cache writes (every out_slot is -1)."""
    total = num_rows * row_len
    req_rows = torch.arange(num_rows, device=device)
    return AttentionMetadata(
        req_to_token=torch.arange(total, device=device, dtype=torch.int32).view(num_rows, row_len),
        req_rows=req_rows,
        seq_lens=torch.full((num_rows,), row_len, dtype=torch.int32, device=device),
        extend_lens=torch.full((num_rows,), row_len, dtype=torch.int32, device=device),
        q_start=(req_rows * row_len).to(torch.int32),
        out_slots=torch.full((total,), -1, dtype=torch.int64, device=device),
        token_req=req_rows.repeat_interleave(row_len, output_size=total),
        token_offset=torch.arange(row_len, device=device).repeat(num_rows),
        num_tokens=total,
        max_extend_len=row_len,
        max_seq_len=row_len,
        causal=causal,
        uniform_extend=row_len,
    )


def _heads_first(x: torch.Tensor, rows: int, num_heads: int) -> torch.Tensor:
    """[R*n, H, D] flat tokens -> [R, H_to, n, D] with kv heads repeated up to num_heads."""
    x = x.unflatten(0, (rows, -1)).transpose(1, 2)  # [R, H, n, D]
    if x.shape[1] != num_heads:
        x = x.repeat_interleave(num_heads // x.shape[1], dim=1)
    return x


class NoCache:
    """`ctx.kv` for forwards that keep no K/V (the target's training pass)."""

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        empty = torch.empty(0)
        return empty, empty


class CausalRowsAttention:
    """The target over `rows` right-padded rows of equal length, causal within each row."""

    name = "dense-causal"

    def __init__(self, rows: int):
        self.rows = rows

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        num_heads = q.shape[1]
        qh = _heads_first(q, self.rows, num_heads)  # [B, Hq, S, D]
        kh = _heads_first(k.to(q.dtype), self.rows, num_heads)
        vh = _heads_first(v.to(q.dtype), self.rows, num_heads)
        attn = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
        return _written(attn.transpose(1, 2).flatten(0, 1), out)  # [B*S, Hq, D]


class ContextKV:
    """`ctx.kv` of a dense draft-block forward: layer i -> its context (k, v) `[B, S, Hkv, D]`."""

    def __init__(self, per_layer: list[tuple[torch.Tensor, torch.Tensor]], rows: int):
        self.per_layer = [(k.unflatten(0, (rows, -1)), v.unflatten(0, (rows, -1))) for k, v in per_layer]

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.per_layer[layer_id]


def block_attention_mask(anchors: torch.Tensor, context_len: int, gamma: int) -> torch.Tensor:
    """[B, 1, A*gamma, S + A*gamma] bool: True where a query may attend.

    anchors [B, A] int64 (the anchor positions p). Query rows are laid (anchor a, block row j);
    keys are the S context positions, then the A*gamma block rows. Block a sees context keys
    `< p_a` and every row of its own block (non-causal), nothing of the other blocks."""
    batch, num_anchors = anchors.shape
    device = anchors.device
    ctx_pos = torch.arange(context_len, device=device)
    sees_ctx = ctx_pos[None, None, :] < anchors[:, :, None]  # [B, A, S]
    sees_ctx = sees_ctx[:, :, None, :].expand(batch, num_anchors, gamma, context_len)
    block_of = torch.arange(num_anchors, device=device).repeat_interleave(gamma)  # [A*gamma]
    sees_block = block_of[:, None] == block_of[None, :]  # [A*gamma, A*gamma]
    sees_block = sees_block[None].expand(batch, -1, -1)
    mask = torch.cat([sees_ctx.reshape(batch, num_anchors * gamma, context_len), sees_block], dim=-1)
    return mask[:, None]


class DraftBlockAttention:
    """Drafter blocks for anchors [B, A] against dense context K/V (see the module doc)."""

    name = "dense-draft-block"

    def __init__(self, anchors: torch.Tensor, context_len: int, gamma: int):
        self.rows = anchors.shape[0]
        self.mask = block_attention_mask(anchors, context_len, gamma)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [B*A*gamma, Hq, D], k/v [B*A*gamma, Hkv, D]; k_cache/v_cache: context [B, S, Hkv, D]."""
        num_heads = q.shape[1]
        # One dtype for q, k, v (under autocast the normed, rotated k can be fp32 while v is bf16).
        keys = torch.cat(
            [k_cache.to(q.dtype), k.to(q.dtype).unflatten(0, (self.rows, -1))], dim=1
        )  # [B, S+A*g, Hkv, D]
        values = torch.cat([v_cache.to(q.dtype), v.to(q.dtype).unflatten(0, (self.rows, -1))], dim=1)
        group = num_heads // keys.shape[2]
        keys = keys.transpose(1, 2).repeat_interleave(group, dim=1)  # [B, Hq, S+A*g, D]
        values = values.transpose(1, 2).repeat_interleave(group, dim=1)
        qh = _heads_first(q, self.rows, num_heads)  # [B, Hq, A*g, D]
        attn = F.scaled_dot_product_attention(qh, keys, values, attn_mask=self.mask, scale=scale)
        return _written(attn.transpose(1, 2).flatten(0, 1), out)


class StaticCache:
    """K/V of `rows` sequences in contiguous head-first buffers `[rows, Hkv, max_len, D]`, one
    pair per layer (head-first so attention reads them without a copy)."""

    def __init__(
        self,
        num_layers: int,
        rows: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (num_layers, rows, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def rows(self, start: int, end: int) -> StaticCache:
        """A view of rows [start, end) (shares the buffers)."""
        view = object.__new__(StaticCache)
        view.k, view.v = self.k[:, start:end], self.v[:, start:end]
        return view

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer_id], self.v[layer_id]


class StaticCacheAttention:
    """Each row writes its n new tokens at `positions [B, n]` and attends to its keys at
    positions <= the query's own. Rows may be at different lengths; a right-padded prefill
    writes filler past a row's prompt, which that row's decode overwrites before any query
    can see it (a query at t only sees keys <= t, all written by then).

    GQA is folded into the query axis (`[B, Hkv, n*G, D]` against `[B, Hkv, Lmax, D]`), so the
    cache is never repeated per query head."""

    name = "dense-static-cache"

    def __init__(self) -> None:
        self.positions: torch.Tensor | None = None  # [B, n] int64
        self.mask: torch.Tensor | None = None  # [B, 1, n, Lmax] bool

    def set_positions(self, positions: torch.Tensor, max_len: int) -> None:
        self.positions = positions
        keys = torch.arange(max_len, device=positions.device)
        self.mask = (keys[None, None, :] <= positions[:, :, None])[:, None]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [B*n, Hq, D], k/v [B*n, Hkv, D]; k_cache/v_cache [B, Hkv, Lmax, D]."""
        if self.positions is None or self.mask is None:
            raise RuntimeError("StaticCacheAttention: set_positions before the forward")
        rows, n = self.positions.shape
        _, num_kv_heads, max_len, head_dim = k_cache.shape
        num_heads = q.shape[1]
        group = num_heads // num_kv_heads
        row_idx = torch.arange(rows, device=q.device)[:, None].expand(rows, n)
        # Advanced indices (row, position) around a slice put the indexed dims first: [B, n, Hkv, D].
        k_cache[row_idx, :, self.positions] = k.unflatten(0, (rows, n)).to(k_cache.dtype)
        v_cache[row_idx, :, self.positions] = v.unflatten(0, (rows, n)).to(v_cache.dtype)
        # [B*n, Hq, D] -> [B, Hkv, n*G, D], row (j, g) = j*G + g.
        q_rows = (
            q.view(rows, n, num_kv_heads, group, head_dim)
            .transpose(1, 2)
            .reshape(rows, num_kv_heads, n * group, head_dim)
        )
        mask = self.mask.repeat_interleave(group, dim=2)  # [B, 1, n*G, Lmax]
        attn = F.scaled_dot_product_attention(
            q_rows, k_cache.to(q.dtype), v_cache.to(q.dtype), attn_mask=mask, scale=scale
        )
        attn = attn.view(rows, num_kv_heads, n, group, head_dim).transpose(1, 2)
        return _written(attn.reshape(rows * n, num_heads, head_dim), out)
