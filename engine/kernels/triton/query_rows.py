"""The query rows a paged-attention program owns, shared by the split-KV decode kernel and
the extend kernel.

A program serves one kv head of one request. Its rows are pairs (query j, head g) of the G
query heads that share the kv head, numbered `j * G + g`, so each key tile serves all G heads
(GQA). `query_rows` maps row numbers to where they live in the [T, Hq, D] query and output
tensors; `row_offsets` gives the element offsets of a [R, BLOCK_D] tile of such rows.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def query_rows(rows, kv_head, q_first, extend_len, GROUP: tl.constexpr):
    """(token [R] int64, head [R], query_j [R], row_valid [R]) of rows [R] of the request whose
    first new token is `q_first`; rows past its `extend_len` new tokens are not valid."""
    query_j = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    return q_first + query_j, head, query_j, query_j < extend_len


@triton.jit
def row_offsets(token, head, dims, stride_t, stride_h):
    """[R, BLOCK_D] offsets of rows (token [R], head [R]) of a [T, H, D] tensor with unit last stride."""
    return token[:, None] * stride_t + head[:, None] * stride_h + dims[None, :]
