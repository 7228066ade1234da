"""Attention over a shared prefix once for all the requests that share it (cascade attention;
docs/design.md §4.9).

A forward whose `meta.shared` names keys [0, P) that several requests read through the same
slots runs in two passes:

1. the shared pass (`_shared_prefix_kernel`): one program per (block of BLOCK_M query rows,
   kv head, key split). Its rows are (token t, head g) pairs of any requests, laid
   `t * G + g`, so the P keys, read through one table row, are loaded once per row block
   instead of once per request, and scored as one dense tile product. Each split writes a
   partial: the output normalised by its own softmax sum, `[T, Hq, S, D]` fp32, and the sum's
   log-sum-exp, `[T, Hq, S]` (log2 domain; -inf for a row whose request does not share);
2. the own pass, each request's keys [shared.lens[b], seq_len): the split-KV kernel for
   short windows, the extend kernel for chunks (per part of a mixed forward). A program that
   walks all of a row's own keys folds the shared partials into its softmax state
   (online_softmax.fold_partials) and writes the output; split-KV with several splits
   writes its own partials after the shared ones and the split-KV module's merge kernel
   combines them.

The grid and split counts come from host bounds only (T, the longest context), so a decode
graph captures the whole of it.

Reference: engine.kernels.attention.paged_attention_torch (which ignores `shared`: the answer
is the same, summed in another order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.triton.decode_attention import (
    MAX_ROWS,
    num_kv_splits,
    num_sms,
    own_keys_launches,
    split_kv_rows,
)
from engine.kernels.triton.extend_attention import extend_attention_launches
from engine.kernels.triton.launch import CacheLaunch, LayerLaunch
from engine.kernels.triton.online_softmax import attend_keys, normalize

LOG2E = math.log2(math.e)
MAX_SHARED_SPLITS = 16
MIN_SHARED_SPLIT_TOKENS = 256  # a split walks at least this many keys at the host's bound on P


@triton.jit
def _shared_prefix_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    req_to_token_ptr,
    table_row_ptr,  # [1] int32: the row whose first P entries are the shared slots
    length_ptr,  # [1] int32: P
    shared_lens_ptr,  # [B] int32: P for a request that shares, else 0
    token_req_ptr,  # [T] int64: request of each query token
    partial_o_ptr,  # [T, Hq, S, D] fp32
    partial_lse_ptr,  # [T, Hq, S] fp32, log2 domain
    num_tokens,
    num_splits,
    scale_log2e,
    stride_qt,
    stride_qh,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    stride_r2t,
    stride_pt,
    stride_ph,
    stride_ps,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    length = tl.load(length_ptr)
    split_len = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N
    kv_begin = tl.minimum(split * split_len, length)
    kv_end = tl.minimum(kv_begin + split_len, length)
    full_end = kv_begin + ((kv_end - kv_begin) // BLOCK_N) * BLOCK_N

    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    token = (rows // GROUP).to(tl.int64)
    head = kv_head * GROUP + rows % GROUP
    in_range = token < num_tokens
    req = tl.load(token_req_ptr + token, mask=in_range, other=0)
    shares = in_range & (tl.load(shared_lens_ptr + req, mask=in_range, other=0) > 0)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=shares[:, None] & dim_valid[None, :],
        other=0.0,
    )

    slot_row_ptr = req_to_token_ptr + tl.load(table_row_ptr).to(tl.int64) * stride_r2t
    unused_bound = tl.zeros([BLOCK_M], tl.int32) + kv_end  # causal bound, unread (non-causal)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m_i, l_i = attend_keys(
        q, acc, m_i, l_i, kv_begin, full_end, kv_end, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
        stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, unused_bound, scale_log2e,
        BLOCK_N, False, INPUT_PRECISION,
    )  # fmt: skip

    o = normalize(acc, l_i)
    partial = token * stride_pt + head * stride_ph + split * stride_ps
    written = in_range[:, None] & dim_valid[None, :]
    tl.store(partial_o_ptr + partial[:, None] * HEAD_DIM + dims[None, :], o, mask=written)
    empty = (l_i == 0.0) | (shares == 0)  # nothing seen, or a request that does not share
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
    tl.store(partial_lse_ptr + partial, lse, mask=in_range)


@dataclass(frozen=True)
class SharedTiles:
    """Launch shape of the shared pass."""

    block_m: int  # query rows (token, head) per program
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    num_splits: int | None = None  # key splits; None: num_shared_splits(...)


def default_tiles(head_dim: int, rows: int, device: torch.device) -> SharedTiles:
    """The shared pass's tiles for `rows = T * G` query rows per kv head."""
    if device.type != "cuda":  # the interpreter: small tiles keep tests quick and multi-block
        return SharedTiles(16, 16, 4, 2)
    # 64 x 64 tiles, 4 warps, 3 stages: the fastest or within 2 % of it for decode rows, DSpark
    # verify windows and a mixed step on an H100 (benchmarks/cascade_kernels.py, docs/benchmarks.md)
    block_n = 64 if head_dim <= 128 else 32
    return SharedTiles(max(16, min(64, triton.next_power_of_2(rows))), block_n, 4, 3)


def num_shared_splits(row_blocks: int, num_kv_heads: int, max_length: int, device: torch.device) -> int:
    """Key splits of the shared pass: enough programs to fill the device about twice, none
    shorter than MIN_SHARED_SPLIT_TOKENS at the host's bound on P. Host ints only."""
    by_length = triton.cdiv(max(max_length, 1), MIN_SHARED_SPLIT_TOKENS)
    by_occupancy = triton.cdiv(2 * num_sms(device), max(row_blocks * num_kv_heads, 1))
    return max(1, min(MAX_SHARED_SPLITS, by_length, by_occupancy))


def _own_splits(meta: AttentionMetadata, group: int, num_kv_heads: int, device: torch.device) -> int:
    """Splits of one part's own pass that write partials: the split-KV kernel's when more than
    one, else 0 (a program that folds the shared partials in and writes the output)."""
    if meta.batch_size == 0 or meta.num_tokens == 0 or split_kv_rows(meta, group) > MAX_ROWS:
        return 0
    splits = num_kv_splits(meta.batch_size, num_kv_heads, meta.max_seq_len, device)
    return splits if splits > 1 else 0


def cascade_attention(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    meta: AttentionMetadata,  # with `shared`; its parts (a mixed forward) carry theirs
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    tiles: SharedTiles | None = None,  # None: default_tiles(...)
) -> torch.Tensor:
    """The forward's attention with the shared keys read once per row block (see above)."""
    for launch in cascade_launches(q, k_cache.shape[1], meta, scale, out, tiles):
        launch(k_cache, v_cache)
    return out


def cascade_launches(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    num_kv_heads: int,
    meta: AttentionMetadata,  # with `shared`; its parts (a mixed forward) carry theirs
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    tiles: SharedTiles | None = None,  # None: default_tiles(...)
) -> list[CacheLaunch]:
    """cascade_attention's launches and their partials' workspace, prepared once for every
    layer of a forward: the shared pass, then each part's own pass."""
    shared = meta.shared
    assert shared is not None
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0 or meta.batch_size == 0:
        return []
    group = num_q_heads // num_kv_heads
    rows = num_tokens * group
    tiles = tiles or default_tiles(head_dim, rows, q.device)
    row_blocks = triton.cdiv(rows, tiles.block_m)
    shared_splits = tiles.num_splits or num_shared_splits(row_blocks, num_kv_heads, shared.max_length, q.device)
    parts = meta.parts if meta.parts is not None else (meta,)
    own_splits = [_own_splits(part, group, num_kv_heads, q.device) for part in parts]
    total = shared_splits + max(own_splits)
    partial_o = torch.empty(num_tokens, num_q_heads, total, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(num_tokens, num_q_heads, total, dtype=torch.float32, device=q.device)
    kernel = LayerLaunch(_shared_prefix_kernel, (row_blocks, num_kv_heads, shared_splits))
    leading = (meta.req_to_token, shared.table_row, shared.length, shared.lens, meta.token_req, partial_o, partial_lse)
    counts = (num_tokens, shared_splits, scale * LOG2E, q.stride(0), q.stride(1))
    trailing = (meta.req_to_token.stride(0), *partial_lse.stride())
    constants = {
        "GROUP": group,
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs K >= 16
        "BLOCK_M": tiles.block_m,
        "BLOCK_N": tiles.block_n,
        "INPUT_PRECISION": "ieee" if q.dtype == torch.float32 else None,  # None: the target default (no tf32 on ROCm)
        "num_warps": tiles.num_warps,
        "num_stages": tiles.num_stages,
    }

    def shared_pass(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        kernel(
            q, k_cache, v_cache, *leading, *counts, k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
            v_cache.stride(1), *trailing, **constants,
        )  # fmt: skip

    launches: list[CacheLaunch] = [shared_pass]
    first = 0
    for part, splits in zip(parts, own_splits, strict=True):
        end = first + part.num_tokens
        if end > first and part.batch_size > 0:
            q_part, out_part = q[first:end], out[first:end]
            part_o, part_lse = partial_o[first:end], partial_lse[first:end]
            if split_kv_rows(part, group) <= MAX_ROWS:
                launches += own_keys_launches(
                    q_part, num_kv_heads, part, scale, out_part, part_o, part_lse, shared_splits, max(splits, 1)
                )
            else:
                shared_part = (part_o[:, :, :shared_splits], part_lse[:, :, :shared_splits])
                launches += extend_attention_launches(
                    q_part, num_kv_heads, part, scale, out_part, shared_partials=shared_part
                )
        first = end
    return launches
