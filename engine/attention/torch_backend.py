"""Paged attention in plain torch: the reference for the Triton kernels and the CPU path.

Every request is padded to the host bounds of the forward: its keys are gathered through
`req_to_token` into `[B, Lmax, Hkv, D]` and its queries into `[B, n, Hq, D]`
(`n = max_extend_len`, or `uniform_extend` when the caller laid the queries out `[B, n]`),
then one `scaled_dot_product_attention` call per chunk attends with a boolean mask built
from `seq_lens` and `extend_lens`. All shapes come from host ints of the metadata, so
nothing is read back from the device (DESIGN.md §4).

GQA is folded into the query axis instead of repeating K/V: the G query heads that share a
kv head become G extra query rows, `[b, Hkv, n*G, D]` against `[b, Hkv, L, D]`.

Padding keys (positions at or past `seq_len`, whose table entries may be stale or out of
range) are redirected to the request's own key 0 before the gather and masked out, so an
uninitialised cache row (NaN bits) can never leak in through `0 * NaN`. An empty request
(`seq_len == 0`, e.g. graph padding) has no key at all; its rows are zeroed.

On CPU the padded K/V live in grow-only scratch buffers: a fresh tensor of that size costs
a page fault per 4 KiB on first touch, which measured slower than the gather itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata
from engine.attention.store_kv import store_kv_torch

# Peak bytes of the padded K/V gather plus mask for one chunk of requests. Larger batches
# (or longer contexts) are processed in several chunks; queries too when one request alone
# is over budget (long prefill).
DEFAULT_CHUNK_BYTES = 256 << 20


class Workspace:
    """Grow-only scratch tensors, reused across calls on CPU; plain allocations elsewhere
    (the CUDA caching allocator already reuses memory, and graph capture needs it)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        if device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device=device)
        numel = 1
        for size in shape:
            numel *= size
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self._buffers[(name, dtype)] = buf
        return buf[:numel].view(shape)


def paged_attention_torch(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,  # [T, Hq, D]
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """Attend every query row of `meta` to its request's cached keys (K/V already stored)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if num_tokens != meta.num_tokens:
        raise ValueError(f"q has {num_tokens} rows but meta.num_tokens is {meta.num_tokens}")
    group = num_q_heads // num_kv_heads
    batch = meta.batch_size
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or batch == 0:
        return out
    if workspace is None:
        workspace = Workspace()

    uniform = meta.uniform_extend
    rows_per_req = uniform if uniform is not None else meta.max_extend_len
    if uniform is not None and batch * uniform != num_tokens:
        raise ValueError(f"uniform_extend={uniform} with {batch} requests needs {batch * uniform} rows")
    kv_len = max(1, min(meta.max_seq_len, meta.req_to_token.shape[1]))
    device = q.device

    # [B, n, Hq, D] padded queries; row j >= extend_lens[b] is filler and is never read back.
    if uniform is not None:
        q_pad = q.view(batch, uniform, num_q_heads, head_dim)
        o_pad = out.view(batch, uniform, num_q_heads, head_dim)
    else:
        q_rows = meta.q_start.long()[:, None] + torch.arange(rows_per_req, device=device)
        q_pad = q[q_rows.clamp_(max=num_tokens - 1)]
        o_pad = q.new_empty(batch, rows_per_req, num_q_heads, head_dim)

    kv_bytes_per_req = 2 * kv_len * num_kv_heads * head_dim * k_cache.element_size()
    # one row per request query sees every key below seq_len, causal or not: the mask then
    # broadcasts over rows. Otherwise a causal row per (query, head) pair: bool here, plus
    # SDPA's additive copy of it.
    causal = meta.causal and rows_per_req > 1
    mask_bytes_per_row = group * kv_len * (1 + q.element_size()) if causal else 0
    req_chunk = max(1, chunk_bytes // (kv_bytes_per_req + rows_per_req * mask_bytes_per_row))
    row_chunk = max(1, min(rows_per_req, chunk_bytes // max(1, mask_bytes_per_row)))
    for b0 in range(0, batch, req_chunk):
        b1 = min(batch, b0 + req_chunk)
        keys, values = _gather_kv(k_cache, v_cache, meta, b0, b1, kv_len, workspace)
        seq_lens = meta.seq_lens[b0:b1].long()  # [b]
        prefix = seq_lens - meta.extend_lens[b0:b1].long()
        for j0 in range(0, rows_per_req, row_chunk):
            j1 = min(rows_per_req, j0 + row_chunk)
            if causal:
                mask = _causal_mask(prefix, j0, j1, group, kv_len, workspace)
            else:
                positions = torch.arange(kv_len, device=device)
                mask = (positions < seq_lens[:, None])[:, None, None, :]  # [b, 1, 1, L]
            o_pad[b0:b1, j0:j1] = _sdpa_grouped(q_pad[b0:b1, j0:j1], keys, values, mask, scale)
        # an empty request has no key to attend: its (padding) rows are NaN, make them 0
        o_pad[b0:b1].masked_fill_((seq_lens == 0)[:, None, None, None], 0.0)

    if uniform is None:
        b = meta.token_req.clamp(0, batch - 1)
        j = meta.token_offset.clamp(0, rows_per_req - 1)
        out.copy_(o_pad[b, j])
    return out


def _gather_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    b0: int,
    b1: int,
    kv_len: int,
    workspace: Workspace,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of requests b0..b1 as [b, Hkv, L, D] views of scratch buffers."""
    slots = meta.req_to_token[meta.req_rows[b0:b1], :kv_len].long()  # [b, L]
    positions = torch.arange(kv_len, device=slots.device)
    # padding positions read the request's key 0 (finite whenever seq_len >= 1), then the
    # clamp keeps garbage ids of empty requests inside the cache
    slots = torch.where(positions < meta.seq_lens[b0:b1, None], slots, slots[:, :1])
    slots = slots.clamp_(0, k_cache.shape[0] - 1).view(-1)
    shape = (b1 - b0, kv_len) + tuple(k_cache.shape[1:])
    keys = workspace.get("keys", shape, k_cache.dtype, k_cache.device)
    values = workspace.get("values", shape, v_cache.dtype, v_cache.device)
    torch.index_select(k_cache, 0, slots, out=keys.view(-1, *k_cache.shape[1:]))
    torch.index_select(v_cache, 0, slots, out=values.view(-1, *v_cache.shape[1:]))
    return keys.transpose(1, 2), values.transpose(1, 2)


def _causal_mask(
    prefix: torch.Tensor,  # [b] int64: seq_len - extend_len
    j0: int,
    j1: int,
    group: int,
    kv_len: int,
    workspace: Workspace,
) -> torch.Tensor:  # [b, 1, (j1 - j0) * G, L] bool, rows ordered (query j, head g)
    """Row j sees keys [0, prefix + j]. Filler rows (j >= extend_len) see past seq_len, onto
    redirected key-0 copies: finite, and never read back."""
    device = prefix.device
    query_j = torch.arange(j0 * group, j1 * group, device=device) // group
    last_key = prefix[:, None] + query_j  # [b, rows]
    positions = torch.arange(kv_len, device=device)
    mask = workspace.get("mask", (prefix.shape[0], last_key.shape[1], kv_len), torch.bool, device)
    torch.le(positions, last_key[:, :, None], out=mask)
    return mask[:, None]


def _sdpa_grouped(
    q: torch.Tensor,  # [b, n, Hq, D]
    keys: torch.Tensor,  # [b, Hkv, L, D]
    values: torch.Tensor,  # [b, Hkv, L, D]
    mask: torch.Tensor,  # [b, 1, n*G or 1, L] bool
    scale: float,
) -> torch.Tensor:  # [b, n, Hq, D]
    b, n, num_q_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    # [b, n, Hkv, G, D] -> [b, Hkv, n*G, D]: each kv head's G query heads become rows.
    q_rows = q.view(b, n, num_kv_heads, group, head_dim).transpose(1, 2)
    q_rows = q_rows.reshape(b, num_kv_heads, n * group, head_dim)
    o = F.scaled_dot_product_attention(q_rows, keys, values, attn_mask=mask, scale=scale)
    return o.view(b, num_kv_heads, n, group, head_dim).transpose(1, 2).reshape(b, n, num_q_heads, head_dim)


class TorchAttentionBackend:
    """AttentionBackend in plain torch (any device; the production path on CPU)."""

    name = "torch"

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self.workspace = Workspace()

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
        v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,  # [T, Hq, D]; allocated when None
    ) -> torch.Tensor:
        store_kv_torch(k, v, k_cache, v_cache, meta.out_slots)
        return paged_attention_torch(
            q, k_cache, v_cache, meta, scale, out=out, chunk_bytes=self.chunk_bytes, workspace=self.workspace
        )
