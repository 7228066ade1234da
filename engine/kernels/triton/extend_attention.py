"""Ragged paged attention for prefill and extend (any number of new rows per request).

One program owns (request b, kv head, block of BLOCK_M query rows). A row is a pair
(query j, head g) of the G query heads that share the kv head, laid `j * G + g`, so each
key tile loaded through `req_to_token` serves all G heads (GQA) and a short extend still
fills the tile. FlashAttention-2 style online softmax in fp32 (Dao, 2023; the key walk is
online_softmax.attend_keys): keys every row of the block may see are walked first without
masks; the causal diagonal (and the ragged end of the request) is walked after, masked.

The grid is (B, Hkv, cdiv(max_extend_len * G, BLOCK_M)) from host bounds; programs past a
request's own extend exit at once. Causal blocks are scheduled longest first.

Reference: engine.kernels.attention.paged_attention_torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.triton.online_softmax import attend_keys, empty_state, normalize
from engine.kernels.triton.paged_launch import paged_args, paged_constants, rows_per_request
from engine.kernels.triton.query_rows import query_rows, row_offsets


@triton.jit
def _extend_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    seq_lens_ptr,
    extend_lens_ptr,
    q_start_ptr,
    out_ptr,
    scale_log2e,
    stride_qt,
    stride_qh,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    stride_r2t,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    block = tl.num_programs(2) - 1 - tl.program_id(2)  # heaviest causal blocks first

    extend_len = tl.load(extend_lens_ptr + req)
    if block * BLOCK_M >= extend_len * GROUP:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    q_first = tl.load(q_start_ptr + req).to(tl.int64)
    slot_row_ptr = req_to_token_ptr + tl.load(req_rows_ptr + req).to(tl.int64) * stride_r2t
    prefix_len = seq_len - extend_len

    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    token, head, query_j, row_valid = query_rows(rows, kv_head, q_first, extend_len, GROUP)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    tile_valid = row_valid[:, None] & dim_valid[None, :]
    q = tl.load(q_ptr + row_offsets(token, head, dims, stride_qt, stride_qh), mask=tile_valid, other=0.0)

    last_key = prefix_len + query_j
    if CAUSAL:
        # keys < prefix + first_j + 1 are visible to every row of the block
        first_j = (block * BLOCK_M) // GROUP
        last_j = tl.minimum((block * BLOCK_M + BLOCK_M - 1) // GROUP, extend_len - 1)
        unmasked_end = prefix_len + first_j + 1
        kv_end = prefix_len + last_j + 1
    else:
        unmasked_end = seq_len
        kv_end = seq_len
    unmasked_end = (unmasked_end // BLOCK_N) * BLOCK_N

    acc, m_i, l_i = empty_state(BLOCK_M, BLOCK_D)
    acc, m_i, l_i = attend_keys(
        q, acc, m_i, l_i, 0, unmasked_end, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
        stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, last_key,
        scale_log2e, BLOCK_N, False, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip
    acc, m_i, l_i = attend_keys(
        q, acc, m_i, l_i, unmasked_end, kv_end, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
        stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, last_key,
        scale_log2e, BLOCK_N, True, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip

    o = normalize(acc, l_i)
    out = out_ptr + row_offsets(token, head, dims, stride_ot, stride_oh)
    tl.store(out, o.to(out_ptr.dtype.element_ty), mask=tile_valid)


def _default_blocks(head_dim: int, rows: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a forward with `rows = max_extend_len * G`."""
    if device.type != "cuda":  # the interpreter: small tiles keep tests quick and multi-block
        return 16, 16, 4
    if head_dim <= 64:
        block_m, block_n, warps = 128, 64, 4
    elif head_dim <= 128:
        block_m, block_n, warps = 128, 64, 8
    else:
        block_m, block_n, warps = 64, 32, 8
    return min(block_m, max(16, triton.next_power_of_2(rows))), block_n, warps


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Ragged prefill/extend attention, causal or not (K/V already stored in the cache)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    batch = meta.batch_size
    rows_per_req = rows_per_request(meta)
    if num_tokens == 0 or batch == 0 or rows_per_req == 0:
        return out
    rows = rows_per_req * group
    default_m, default_n, warps = _default_blocks(head_dim, rows, q.device)
    block_m = block_m or default_m
    block_n = block_n or default_n
    _extend_kernel[(batch, num_kv_heads, triton.cdiv(rows, block_m))](
        *paged_args(q, k_cache, v_cache, meta, scale, out),
        **paged_constants(q, k_cache, meta),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
        num_stages=2,
    )
    return out
