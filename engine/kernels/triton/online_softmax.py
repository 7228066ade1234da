"""One key tile of paged attention with an fp32 online softmax (FlashAttention-2, Dao 2023),
shared by the split-KV decode kernel and the extend kernel.

A program holds a block of query rows `q [R, BLOCK_D]` (rows (query j, head g) of one kv head)
and its running state: `acc [R, BLOCK_D]` (unnormalised output), `m_i [R]` (running max of
the scores, log2 domain) and `l_i [R]` (running sum of exp2(score - m_i)). `attend_tile`
folds the next BLOCK_N keys, read through the request's `req_to_token` row, into that state;
`attend_keys` walks a range of keys tile by tile, the tiles every row may see whole without
masks first; `normalize` gives the output once every tile is in. Rows that see no key yet keep
m_i = -inf and l_i = 0, and normalise to 0.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(
    q,  # [R, BLOCK_D]
    acc,  # [R, BLOCK_D] fp32
    m_i,  # [R] fp32
    l_i,  # [R] fp32
    start,  # first key position of the tile
    k_cache_ptr,
    v_cache_ptr,
    slot_row_ptr,  # req_to_token row of the request
    kv_head,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    dims,  # [BLOCK_D]
    dim_valid,  # [BLOCK_D]
    last_key,  # [R] causal bound of each row
    kv_end,  # keys at or past it are masked (MASKED only)
    scale_log2e,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the tile is below kv_end and visible to every row
    CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """(acc, m_i, l_i) after the keys [start, start + BLOCK_N)."""
    cols = start + tl.arange(0, BLOCK_N)
    if MASKED:
        col_valid = cols < kv_end
        slot = tl.load(slot_row_ptr + cols, mask=col_valid, other=0).to(tl.int64)
        kv_mask = col_valid[:, None] & dim_valid[None, :]
    else:
        slot = tl.load(slot_row_ptr + cols).to(tl.int64)
        kv_mask = dim_valid[None, :]
    k = tl.load(
        k_cache_ptr + slot[:, None] * stride_kc_slot + kv_head * stride_kc_h + dims[None, :],
        mask=kv_mask,
        other=0.0,
    )
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale_log2e  # [R, BLOCK_N]
    if MASKED:
        visible = col_valid[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= last_key[:, None])
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        v_cache_ptr + slot[:, None] * stride_vc_slot + kv_head * stride_vc_h + dims[None, :],
        mask=kv_mask,
        other=0.0,
    )
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def attend_keys(
    q,  # [R, BLOCK_D]
    acc,  # [R, BLOCK_D] fp32
    m_i,  # [R] fp32
    l_i,  # [R] fp32
    kv_begin,  # first key
    unmasked_end,  # kv_begin + a multiple of BLOCK_N: keys before it are visible to every row
    kv_end,  # keys at or past it are not read
    k_cache_ptr,
    v_cache_ptr,
    slot_row_ptr,
    kv_head,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    dims,
    dim_valid,
    last_key,  # [R] causal bound of each row
    scale_log2e,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """(acc, m_i, l_i) after the keys [kv_begin, kv_end): the tiles before `unmasked_end`
    without masks, the rest masked by `kv_end` (and by `last_key` if CAUSAL)."""
    for start in range(kv_begin, unmasked_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, start, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
            stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, last_key, kv_end,
            scale_log2e, BLOCK_N, False, CAUSAL, INPUT_PRECISION,
        )  # fmt: skip
    for start in range(unmasked_end, kv_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, start, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
            stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, last_key, kv_end,
            scale_log2e, BLOCK_N, True, CAUSAL, INPUT_PRECISION,
        )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def fold_partials(
    acc,  # [R, BLOCK_D] fp32
    m_i,  # [R] fp32
    l_i,  # [R] fp32
    partial_o_ptr,  # [T, Hq, S, D] fp32: outputs normalised by their own sums
    partial_lse_ptr,  # [T, Hq, S] fp32: their log-sum-exps (log2), -inf when empty
    at,  # [R] int64: token * stride_pt + head * stride_ph of each row
    stride_ps,
    num_splits,
    dims,  # [BLOCK_D]
    dim_valid,  # [BLOCK_D]
    row_valid,  # [R]
    HEAD_DIM: tl.constexpr,
):
    """(acc, m_i, l_i) with another kernel's partial results over other keys folded in: a
    partial of log-sum-exp `lse` stands for 2^lse x its output (the rescaling of
    Flash-Decoding), so the state after it is the state over both sets of keys."""
    for split in range(num_splits):
        index = at + split * stride_ps
        lse = tl.load(partial_lse_ptr + index, mask=row_valid, other=float("-inf"))
        written = row_valid[:, None] & dim_valid[None, :]
        o = tl.load(partial_o_ptr + index[:, None] * HEAD_DIM + dims[None, :], mask=written, other=0.0)
        m_new = tl.maximum(m_i, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        weight = tl.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + o * weight[:, None]
        l_i = l_i * alpha + weight
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def normalize(acc, l_i):
    """acc [R, BLOCK_D] / l_i [R]: the attention output of the keys seen; 0 for rows with none."""
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
