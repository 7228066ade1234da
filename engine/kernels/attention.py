"""Paged attention in plain torch: the reference of the attention kernels (the Triton ones in
engine/kernels/triton/{decode,extend}_attention.py, the C one in engine/kernels/cpu/) and the
path of engine.attention.TorchAttentionBackend for whatever the C kernel does not serve.

Every request is padded to the host bounds of the forward: its keys are gathered through
`req_to_token` into `[B, Lmax, Hkv, D]` and its queries into `[B, n, Hq, D]`
(`n = max_extend_len`, or `uniform_extend` when the caller laid the queries out `[B, n]`),
then one `scaled_dot_product_attention` call per chunk attends with a mask built from
`seq_lens` and `extend_lens`. All shapes come from host ints of the metadata, so nothing is
read back from the device (docs/design.md §4).

GQA is folded into the query axis instead of repeating K/V: the G query heads that share a
kv head become G extra query rows, `[b, Hkv, n*G, D]` against `[b, Hkv, L, D]`.

Padding keys (positions at or past `seq_len`, whose table entries may be stale or out of
range) are redirected to the request's own key 0 before the gather and masked out, so an
uninitialised cache row (NaN bits) can never leak in through `0 * NaN`. An empty request
(`seq_len == 0`, e.g. graph padding) has no key at all; its rows are zeroed.

What depends on the metadata alone (the gather ids, the masks, the chunking) is an
`AttentionPlan`. Every layer of a forward attends with the same metadata object, so on CPU
the backend plans once per forward and every layer reuses it: only the K/V gathers and the
SDPA call remain per layer. On CPU the padded K/V also live in grow-only scratch buffers: a
fresh tensor of that size costs a page fault per 4 KiB on first touch, which measured slower
than the gather itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels.attention_metadata import AttentionMetadata

# Peak bytes of the padded K/V gather plus mask for one chunk of requests. Larger batches
# (or longer contexts) are processed in several chunks; queries too when one request alone
# is over budget (long prefill). The masks a plan keeps for a whole forward take at most as
# much again.
DEFAULT_CHUNK_BYTES = 256 << 20


class Workspace:
    """Grow-only scratch tensors, reused across calls on CPU; plain allocations elsewhere
    (the CUDA caching allocator already reuses memory, and graph capture needs it)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
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


@dataclass
class RequestChunk:
    """Requests b0..b1 of a forward, attended together: one K/V gather per layer."""

    b0: int
    b1: int
    slots: torch.Tensor  # [b * L] int64: cache row of each padded key (padding: the request's key 0)
    prefix: torch.Tensor  # [b] int64: seq_len - extend_len
    seq_lens: torch.Tensor  # [b] int64
    empty: torch.Tensor  # [b, 1, 1, 1] bool: requests with no key (seq_len == 0)
    masks: list[torch.Tensor] | None = None  # per row chunk, when the plan keeps them (AttentionPlan.mask)


class AttentionPlan:
    """The layer-independent part of attending with `meta`: chunking, gather ids and masks.
    It serves every call whose q and cache have the shapes and dtypes it was built for."""

    def __init__(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
        meta: AttentionMetadata,
        chunk_bytes: int,
        workspace: Workspace,
    ) -> None:
        num_tokens, num_q_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[1]
        batch = meta.batch_size
        uniform = meta.uniform_extend
        self.meta = meta
        self.shapes = (q.shape, q.dtype, k_cache.shape)
        self.dtype = q.dtype  # of the additive masks
        self.group = num_q_heads // num_kv_heads
        self.rows_per_req = uniform if uniform is not None else meta.max_extend_len
        self.kv_len = max(1, min(meta.max_seq_len, meta.req_to_token.shape[1]))

        kv_bytes_per_req = 2 * self.kv_len * num_kv_heads * head_dim * k_cache.element_size()
        # one row per request query sees every key below seq_len, causal or not: the mask then
        # broadcasts over rows. Otherwise a causal row per (query, head) pair: bool, then the
        # additive mask SDPA reads.
        self.causal = meta.causal and self.rows_per_req > 1
        mask_bytes_per_row = self.group * self.kv_len * (1 + q.element_size()) if self.causal else 0
        req_chunk = max(1, chunk_bytes // (kv_bytes_per_req + self.rows_per_req * mask_bytes_per_row))
        self.row_chunk = max(1, min(self.rows_per_req, chunk_bytes // max(1, mask_bytes_per_row)))
        # Masks are kept for every layer when all of them fit one chunk's budget (decode,
        # verify, drafter blocks, short prefills); long prefills rebuild them per call.
        keep_masks = batch * self.rows_per_req * mask_bytes_per_row <= chunk_bytes

        self.chunks: list[RequestChunk] = []
        for b0 in range(0, batch, req_chunk):
            b1 = min(batch, b0 + req_chunk)
            seq_lens = meta.seq_lens[b0:b1].long()
            chunk = RequestChunk(
                b0=b0, b1=b1, slots=_gather_slots(meta, b0, b1, self.kv_len, k_cache.shape[0]),
                prefix=seq_lens - meta.extend_lens[b0:b1].long(), seq_lens=seq_lens,
                empty=(seq_lens == 0)[:, None, None, None],
            )  # fmt: skip
            if keep_masks:
                chunk.masks = [self._build_mask(chunk, j0, workspace) for j0 in self.row_starts()]
            self.chunks.append(chunk)

        # Ragged layout: request b's queries are rows q_start[b] + j of q, and query row t is
        # (token_req[t], token_offset[t]) of the padded output.
        self.q_rows: torch.Tensor | None = None  # [B, n] int64
        self.out_index: tuple[torch.Tensor, torch.Tensor] | None = None  # ([T], [T]) int64
        if uniform is None:
            q_rows = meta.q_start.long()[:, None] + torch.arange(self.rows_per_req, device=q.device)
            self.q_rows = q_rows.clamp_(max=num_tokens - 1)
            self.out_index = (meta.token_req.clamp(0, batch - 1), meta.token_offset.clamp(0, self.rows_per_req - 1))

    def serves(self, q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> bool:
        return meta is self.meta and self.shapes == (q.shape, q.dtype, k_cache.shape)

    def row_starts(self) -> range:
        return range(0, self.rows_per_req, self.row_chunk)

    def mask(self, chunk: RequestChunk, j0: int, workspace: Workspace) -> torch.Tensor:
        """[b, 1, (j1 - j0) * G or 1, L] additive mask of queries j0..j1 of the chunk."""
        if chunk.masks is not None:
            return chunk.masks[j0 // self.row_chunk]
        return self._build_mask(chunk, j0, workspace)

    def _build_mask(self, chunk: RequestChunk, j0: int, workspace: Workspace) -> torch.Tensor:
        """0 where visible, -inf elsewhere, in q's dtype: what SDPA makes of a boolean mask
        on every call, made here once."""
        if self.causal:
            j1 = min(self.rows_per_req, j0 + self.row_chunk)
            visible = _causal_mask(chunk.prefix, j0, j1, self.group, self.kv_len, workspace)
        else:
            positions = torch.arange(self.kv_len, device=chunk.seq_lens.device)
            visible = (positions < chunk.seq_lens[:, None])[:, None, None, :]  # [b, 1, 1, L]
        additive = torch.zeros(visible.shape, dtype=self.dtype, device=visible.device)
        return additive.masked_fill_(visible.logical_not(), float("-inf"))


def paged_attention_torch(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,  # [T, Hq, D]
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workspace: Workspace | None = None,
    plan: AttentionPlan | None = None,  # built here when None or made for other shapes
) -> torch.Tensor:
    """Attend every query row of `meta` to its request's cached keys (K/V already stored)."""
    check_shapes(q, k_cache, meta)
    num_tokens, num_q_heads, head_dim = q.shape
    batch = meta.batch_size
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or batch == 0:
        return out
    if workspace is None:
        workspace = Workspace()
    if plan is None or not plan.serves(q, k_cache, meta):
        plan = AttentionPlan(q, k_cache, meta, chunk_bytes, workspace)

    # [B, n, Hq, D] padded queries; row j >= extend_lens[b] is filler and is never read back.
    if plan.q_rows is None:
        q_pad = q.view(batch, plan.rows_per_req, num_q_heads, head_dim)
        o_pad = out.view(batch, plan.rows_per_req, num_q_heads, head_dim)
    else:
        q_pad = q[plan.q_rows]
        o_pad = q.new_empty(batch, plan.rows_per_req, num_q_heads, head_dim)

    for chunk in plan.chunks:
        b0, b1 = chunk.b0, chunk.b1
        keys, values = _gather_kv(k_cache, v_cache, chunk, plan.kv_len, workspace)
        for j0 in plan.row_starts():
            j1 = min(plan.rows_per_req, j0 + plan.row_chunk)
            mask = plan.mask(chunk, j0, workspace)
            o_pad[b0:b1, j0:j1] = _sdpa_grouped(q_pad[b0:b1, j0:j1], keys, values, mask, scale)
        # an empty request has no key to attend: its (padding) rows are NaN, make them 0
        o_pad[b0:b1].masked_fill_(chunk.empty, 0.0)

    if plan.out_index is not None:
        out.copy_(o_pad[plan.out_index])
    return out


def check_shapes(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> None:
    num_tokens, num_q_heads, _ = q.shape
    num_kv_heads = k_cache.shape[1]
    batch, uniform = meta.batch_size, meta.uniform_extend
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if num_tokens != meta.num_tokens:
        raise ValueError(f"q has {num_tokens} rows but meta.num_tokens is {meta.num_tokens}")
    if uniform is not None and batch * uniform != num_tokens:
        raise ValueError(f"uniform_extend={uniform} with {batch} requests needs {batch * uniform} rows")


def _gather_slots(meta: AttentionMetadata, b0: int, b1: int, kv_len: int, num_rows: int) -> torch.Tensor:
    """[b * L] int64 cache rows of the padded keys of requests b0..b1."""
    slots = meta.req_to_token[meta.req_rows[b0:b1], :kv_len].long()  # [b, L]
    positions = torch.arange(kv_len, device=slots.device)
    # padding positions read the request's key 0 (finite whenever seq_len >= 1), then the
    # clamp keeps garbage ids of empty requests inside the cache
    slots = torch.where(positions < meta.seq_lens[b0:b1, None], slots, slots[:, :1])
    return slots.clamp_(0, num_rows - 1).view(-1)


def _gather_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: RequestChunk,
    kv_len: int,
    workspace: Workspace,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the chunk's requests as [b, Hkv, L, D] views of scratch buffers."""
    shape = (chunk.b1 - chunk.b0, kv_len) + tuple(k_cache.shape[1:])
    keys = workspace.get("keys", shape, k_cache.dtype, k_cache.device)
    values = workspace.get("values", shape, v_cache.dtype, v_cache.device)
    torch.index_select(k_cache, 0, chunk.slots, out=keys.view(-1, *k_cache.shape[1:]))
    torch.index_select(v_cache, 0, chunk.slots, out=values.view(-1, *v_cache.shape[1:]))
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
    mask: torch.Tensor,  # [b, 1, n*G or 1, L] additive, q's dtype
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
