"""Split-KV ("flash-decoding") paged attention for short query windows.

Used for decode (1 row per request) and for any forward whose `max_extend_len * G` query
rows fit one small tile: DSpark verify windows (W = gamma + 1 <= 16) and drafter blocks.
One program owns (request b, kv head, split s): it loads all `extend * G` query rows that
share the kv head (GQA: the G query heads of a kv head read each key once), walks its
share of the request's keys through `req_to_token`, and keeps an fp32 online softmax
(online_softmax.attend_keys, as the extend kernel does: the tiles every row sees whole
without masks).
A second kernel merges the splits by their log-sum-exp (Dao, Haziza, Massa, Sizov,
"Flash-Decoding for long-context inference", 2023). With one split the first kernel writes
the output itself.

Split sizes are per request, computed on the device from `seq_lens`: every split of request
b covers `ceil(seq_len_b / S)` keys (rounded to BLOCK_N), so short and long requests in one
batch both use all S programs. Under a shared prefix (AttentionMetadata.shared) request b's
splits cover only its own keys, from `shared.lens[b]` on; the shared keys' partial results
come from shared_prefix_attention.py. With one split the kernel folds them in and writes the
output itself; with several, every split writes its partial and one merge combines all. The number of
splits S comes from host bounds only (batch, `max_seq_len`, SM count), so the grid is fixed
for a CUDA graph of a batch-size bucket.

Reference: engine.kernels.attention.paged_attention_torch.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.triton.launch import CacheLaunch, LayerLaunch
from engine.kernels.triton.online_softmax import attend_keys, fold_partials, normalize

LOG2E = math.log2(math.e)
MAX_SPLITS = 64
MIN_SPLIT_TOKENS = 128  # below this a split is mostly launch and merge overhead
# Query rows (extend * G) one program may hold; larger windows go to the extend kernel.
MAX_ROWS = 64
NUM_STAGES = 2  # software-pipeline depth of the key loop


@triton.jit
def _split_kv_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    seq_lens_ptr,
    extend_lens_ptr,
    q_start_ptr,
    shared_lens_ptr,  # [B] int32: keys before this are another kernel's (HAS_SHARED)
    out_ptr,
    partial_o_ptr,  # [T, Hq, S, D] fp32: written unless DIRECT_OUT; read (folded) if DIRECT_OUT and HAS_SHARED
    partial_lse_ptr,  # [T, Hq, S] fp32 (log2 domain)
    scale_log2e,
    num_splits,
    fold_splits,  # partials to fold in before writing out (DIRECT_OUT and HAS_SHARED)
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
    BLOCK_R: tl.constexpr,  # query rows (extend j, head g) per program, >= 16 for tl.dot
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + req)
    extend_len = tl.load(extend_lens_ptr + req)
    q_first = tl.load(q_start_ptr + req).to(tl.int64)
    table_row = tl.load(req_rows_ptr + req).to(tl.int64)
    prefix_len = seq_len - extend_len

    rows = tl.arange(0, BLOCK_R)
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

    kv_start = 0
    if HAS_SHARED:
        kv_start = tl.load(shared_lens_ptr + req)
    split_len = tl.cdiv(tl.cdiv(seq_len - kv_start, num_splits), BLOCK_N) * BLOCK_N
    kv_begin = kv_start + split * split_len
    kv_end = tl.minimum(kv_begin + split_len, seq_len)
    last_key = prefix_len + query_j  # causal: the last key each row may see

    slot_row_ptr = req_to_token_ptr + table_row * stride_r2t
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    # keys before the window's first row (its prefix) are visible to every row
    visible_to_all = tl.minimum(kv_end, prefix_len + 1) if CAUSAL else kv_end
    unmasked_end = kv_begin + (tl.maximum(visible_to_all - kv_begin, 0) // BLOCK_N) * BLOCK_N
    acc, m_i, l_i = attend_keys(
        q, acc, m_i, l_i, kv_begin, unmasked_end, kv_end, k_cache_ptr, v_cache_ptr, slot_row_ptr, kv_head,
        stride_kc_slot, stride_kc_h, stride_vc_slot, stride_vc_h, dims, dim_valid, last_key, scale_log2e,
        BLOCK_N, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip

    if DIRECT_OUT:
        if HAS_SHARED:
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
    else:
        o = normalize(acc, l_i)
        partial = token * stride_pt + head * stride_ph + split * stride_ps
        empty = l_i == 0.0  # an empty split, or a row whose visible keys all lie in other splits
        tl.store(
            partial_o_ptr + partial[:, None] * HEAD_DIM + dims[None, :],
            o,
            mask=row_valid[:, None] & dim_valid[None, :],
        )
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(partial_lse_ptr + partial, lse, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    partial_o_ptr,  # [T, Hq, S, D] fp32, each split normalised by its own sum
    partial_lse_ptr,  # [T, Hq, S] fp32 (log2 domain), -inf for an empty split
    out_ptr,
    num_splits,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_valid = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    base = token * stride_pt + head * stride_ph + splits * stride_ps
    lse = tl.load(partial_lse_ptr + base, mask=split_valid, other=float("-inf"))
    m = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # 0 for empty splits
    total = tl.sum(weight, 0)
    o = tl.load(
        partial_o_ptr + base[:, None] * HEAD_DIM + dims[None, :],
        mask=split_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )
    o = tl.sum(o * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dims, o.to(out_ptr.dtype.element_ty), mask=dim_valid)


@functools.lru_cache(maxsize=8)
def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter on CPU: a few splits, so tests cover the merge


def num_kv_splits(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Splits per (request, kv head): enough programs to fill the device ~4 times over, and
    no split shorter than MIN_SPLIT_TOKENS at `max_seq_len`. Host ints only."""
    by_length = triton.cdiv(max(max_seq_len, 1), MIN_SPLIT_TOKENS)
    by_occupancy = triton.cdiv(4 * num_sms(device), max(batch * num_kv_heads, 1))
    return max(1, min(MAX_SPLITS, by_length, by_occupancy))


def split_kv_rows(meta: AttentionMetadata, group: int) -> int:
    """Query rows one split-KV program holds for this forward (extend * G)."""
    rows_per_req = meta.uniform_extend if meta.uniform_extend is not None else meta.max_extend_len
    return rows_per_req * group


def decode_attention(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    num_splits: int | None = None,  # None: num_kv_splits(...)
    block_n: int | None = None,
) -> torch.Tensor:
    """Split-KV attention for forwards with `split_kv_rows(meta, G) <= MAX_ROWS` (every key;
    `meta.shared` is for own_keys_launches)."""
    for launch in decode_attention_launches(q, k_cache.shape[1], meta, scale, out, num_splits, block_n):
        launch(k_cache, v_cache)
    return out


def decode_attention_launches(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    num_kv_heads: int,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    num_splits: int | None = None,  # None: num_kv_splits(...)
    block_n: int | None = None,
) -> list[CacheLaunch]:
    """decode_attention's launches, prepared once for every layer of a forward."""
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0 or meta.batch_size == 0:
        return []
    if num_splits is None:
        num_splits = num_kv_splits(meta.batch_size, num_kv_heads, meta.max_seq_len, q.device)
    if num_splits == 1:
        unused = q.new_empty(1, dtype=torch.float32)
        return [_split_kv_launch(q, num_kv_heads, meta, scale, out, (unused, unused), 1, 0, block_n, NUM_STAGES, False)]
    partial_o = torch.empty(num_tokens, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(num_tokens, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    partials = (partial_o, partial_lse)
    return [
        _split_kv_launch(q, num_kv_heads, meta, scale, out, partials, num_splits, 0, block_n, NUM_STAGES, False),
        _merge_launch(partial_o, partial_lse, out),
    ]


def own_keys_launches(
    q: torch.Tensor,  # [T, Hq, D], last dim contiguous
    num_kv_heads: int,
    meta: AttentionMetadata,  # with `shared`: each request's keys from shared.lens[b] on
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    partial_o: torch.Tensor,  # [T, Hq, S_shared + num_splits, D] fp32: the shared pass's splits first
    partial_lse: torch.Tensor,  # [T, Hq, S_shared + num_splits] fp32, log2 domain
    num_shared_splits: int,
    num_splits: int,
    block_n: int | None = None,
    num_stages: int = NUM_STAGES,
) -> list[CacheLaunch]:
    """`out` over every key, given the shared keys' partials: one split folds them in and
    writes `out`; several write their own partials after them, then one merge."""
    if q.shape[0] == 0 or meta.batch_size == 0:
        return []
    assert meta.shared is not None, "own keys follow shared ones: use decode_attention"
    if num_splits == 1:
        partials = (partial_o, partial_lse)
        return [
            _split_kv_launch(
                q, num_kv_heads, meta, scale, out, partials, 1, num_shared_splits, block_n, num_stages, True
            )
        ]
    own = (partial_o[:, :, num_shared_splits:], partial_lse[:, :, num_shared_splits:])
    total = num_shared_splits + num_splits
    return [
        _split_kv_launch(q, num_kv_heads, meta, scale, out, own, num_splits, 0, block_n, num_stages, True),
        _merge_launch(partial_o[:, :, :total], partial_lse[:, :, :total], out),
    ]


def _split_kv_launch(
    q: torch.Tensor,
    num_kv_heads: int,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # written when num_splits == 1
    partials: tuple[torch.Tensor, torch.Tensor],  # (o, lse): written by several splits, else folded in
    num_splits: int,
    fold_splits: int,
    block_n: int | None,
    num_stages: int,
    shared: bool,
) -> CacheLaunch:
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    rows = split_kv_rows(meta, group)
    if rows > MAX_ROWS:
        raise ValueError(f"decode_attention holds at most {MAX_ROWS} query rows per program, got {rows}")
    if block_n is None:
        block_n = 64 if head_dim <= 128 else 32
    partial_o, partial_lse = partials
    stride_pt, stride_ph, stride_ps = partial_lse.stride() if partial_lse.dim() == 3 else (0, 0, 0)
    shared_lens = meta.shared.lens if shared and meta.shared is not None else meta.seq_lens  # unread unless shared
    kernel = LayerLaunch(_split_kv_kernel, (meta.batch_size, num_kv_heads, num_splits))
    leading = (meta.req_to_token, meta.req_rows, meta.seq_lens, meta.extend_lens, meta.q_start, shared_lens, out)
    partial_args = (partial_o, partial_lse, scale * LOG2E, num_splits, fold_splits, q.stride(0), q.stride(1))
    trailing = (meta.req_to_token.stride(0), out.stride(0), out.stride(1), stride_pt, stride_ph, stride_ps)
    constants = {
        "GROUP": group,
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs K >= 16
        "BLOCK_R": max(16, triton.next_power_of_2(rows)),
        "BLOCK_N": block_n,
        "CAUSAL": meta.causal,
        "DIRECT_OUT": num_splits == 1,
        "HAS_SHARED": shared,
        "INPUT_PRECISION": "ieee" if q.dtype == torch.float32 else None,  # None: the target default (no tf32 on ROCm)
        "num_warps": 4,
        "num_stages": num_stages,
    }

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        kernel(
            q, k_cache, v_cache, *leading, *partial_args, k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), *trailing, **constants,
        )  # fmt: skip

    return launch


def _merge_launch(
    partial_o: torch.Tensor,  # [T, Hq, S, D] fp32, contiguous
    partial_lse: torch.Tensor,  # [T, Hq, S] fp32, contiguous; -inf for an empty split
    out: torch.Tensor,  # [T, Hq, D]
) -> CacheLaunch:
    """out[t, h] = the splits' outputs weighted by their share of the softmax sum (a launch
    that reads no cache)."""
    num_tokens, num_q_heads, num_splits, head_dim = partial_o.shape
    kernel = LayerLaunch(_merge_splits_kernel, (num_tokens, num_q_heads))
    args = (partial_o, partial_lse, out, num_splits, *partial_lse.stride(), out.stride(0), out.stride(1))
    constants = {
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),
        "BLOCK_S": triton.next_power_of_2(num_splits),
        "num_warps": 4,
    }

    def launch(_k_cache: torch.Tensor, _v_cache: torch.Tensor) -> None:
        kernel(*args, **constants)

    return launch
