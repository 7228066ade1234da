"""Ragged paged attention for prefill and extend (any number of new rows per request).

One program owns (request b, kv head, block of BLOCK_M query rows). A row is a pair
(query j, head g) of the G query heads that share the kv head, laid `j * G + g`, so each
key tile loaded through `req_to_token` serves all G heads (GQA) and a short extend still
fills the tile. FlashAttention-2 style online softmax in fp32 (Dao, 2023; the tile update is
online_softmax.attend_keys): keys every row of the block may see are walked first without
masks; the causal diagonal (and the ragged end of the request) is walked after, masked.

The grid is (B, Hkv, cdiv(max_extend_len * G, BLOCK_M)) from host bounds; programs past a
request's own extend exit at once. Causal blocks are scheduled longest first.

Under a shared prefix (AttentionMetadata.shared) request b walks only its own keys, from
`shared.lens[b]` on, then folds in the shared keys' partial results that
shared_prefix_attention.py wrote (online_softmax.fold_partials) before writing its output.

Reference: engine.kernels.attention.paged_attention_torch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.triton.launch import CacheLaunch, LayerLaunch
from engine.kernels.triton.online_softmax import attend_keys, fold_partials, normalize

LOG2E = math.log2(math.e)


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
    shared_lens_ptr,  # [B] int32: keys before this are another kernel's (SHARED)
    out_ptr,  # [T, Hq, D]
    partial_o_ptr,  # [T, Hq, S, D] fp32: the shared keys' partial outputs (SHARED)
    partial_lse_ptr,  # [T, Hq, S] fp32: their log-sum-exps, log2 domain (SHARED)
    fold_splits,  # S
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
    stride_pt,
    stride_ph,
    stride_ps,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SHARED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
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
    query_j = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = query_j < extend_len
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    token = q_first + query_j
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )

    last_key = prefix_len + query_j
    kv_start = 0
    if SHARED:
        kv_start = tl.load(shared_lens_ptr + req)
    if CAUSAL:
        # keys < prefix + first_j + 1 are visible to every row of the block
        first_j = (block * BLOCK_M) // GROUP
        last_j = tl.minimum((block * BLOCK_M + BLOCK_M - 1) // GROUP, extend_len - 1)
        unmasked_end = prefix_len + first_j + 1
        kv_end = prefix_len + last_j + 1
    else:
        unmasked_end = seq_len
        kv_end = seq_len
    unmasked_end = kv_start + (tl.maximum(unmasked_end - kv_start, 0) // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m_i, l_i = attend_keys(
        q, acc, m_i, l_i, kv_start, unmasked_end, kv_end, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
        stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, last_key, scale_log2e,
        BLOCK_N, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip

    if SHARED:
        acc, m_i, l_i = fold_partials(
            acc, m_i, l_i, partial_o_ptr, partial_lse_ptr, token * stride_pt + head * stride_ph, stride_ps,
            fold_splits, dims, dim_valid, row_valid, HEAD_DIM,
        )  # fmt: skip
    o = normalize(acc, l_i)
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )


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
    shared_partials: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Ragged prefill/extend attention, causal or not (K/V already stored in the cache).
    `shared_partials` (with `meta.shared`): the shared keys' partial results `([T, Hq, S, D],
    [T, Hq, S])` fp32; each row then walks only its request's own keys and folds them in."""
    for launch in extend_attention_launches(q, k_cache.shape[1], meta, scale, out, block_m, block_n, shared_partials):
        launch(k_cache, v_cache)
    return out


def extend_attention_launches(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    num_kv_heads: int,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    block_m: int | None = None,
    block_n: int | None = None,
    shared_partials: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[CacheLaunch]:
    """extend_attention's launch (none for an empty forward), prepared once for every layer."""
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    batch = meta.batch_size
    rows_per_req = meta.uniform_extend if meta.uniform_extend is not None else meta.max_extend_len
    if num_tokens == 0 or batch == 0 or rows_per_req == 0:
        return []
    rows = rows_per_req * group
    default_m, default_n, warps = _default_blocks(head_dim, rows, q.device)
    block_m = block_m or default_m
    block_n = block_n or default_n
    shared = shared_partials is not None
    if shared_partials is not None:
        assert meta.shared is not None, "shared partials come with the shared keys"
        partial_o, partial_lse = shared_partials
        shared_lens = meta.shared.lens
        fold_splits = partial_lse.shape[2]
        stride_pt, stride_ph, stride_ps = partial_lse.stride()
    else:
        partial_o = partial_lse = shared_lens = meta.seq_lens  # unread
        fold_splits = stride_pt = stride_ph = stride_ps = 0
    kernel = LayerLaunch(_extend_kernel, (batch, num_kv_heads, triton.cdiv(rows, block_m)))
    leading = (meta.req_to_token, meta.req_rows, meta.seq_lens, meta.extend_lens, meta.q_start, shared_lens, out)
    partial_args = (partial_o, partial_lse, fold_splits, scale * LOG2E, q.stride(0), q.stride(1))
    trailing = (meta.req_to_token.stride(0), out.stride(0), out.stride(1), stride_pt, stride_ph, stride_ps)
    constants = {
        "GROUP": group,
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs K >= 16
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "CAUSAL": meta.causal,
        "SHARED": shared,
        "INPUT_PRECISION": "ieee" if q.dtype == torch.float32 else None,  # None: the target default (no tf32 on ROCm)
        "num_warps": warps,
        "num_stages": 2,
    }

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        kernel(
            q, k_cache, v_cache, *leading, *partial_args, k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), *trailing, **constants,
        )  # fmt: skip

    return [launch]
