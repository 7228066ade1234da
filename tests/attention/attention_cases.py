"""Random paged-attention forwards and a float64 per-request reference.

A case is one forward as the engine would issue it: a shuffled pool of pages (page_size 1
or 16) shared by the requests, a `req_to_token` table whose rows are permuted and whose
unused entries are garbage (negative or past the pool), caches whose unused rows and sink
are NaN (a kernel that reads outside the request's keys fails loudly), new K/V as strided
views of one fused projection, and some `out_slots` set to -1 (their old cache content
must then be attended instead). With `shared_len`, the sharing requests read their first
`shared_len` keys through the same pages (a prefix-cache hit) and the forward says so
(`AttentionMetadata.shared`, whose table row is a spare row holding only those slots).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

import torch

from engine.kernels.attention_metadata import AttentionMetadata, SharedPrefix


@dataclass
class AttentionCase:
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D] (strided view)
    v: torch.Tensor  # [T, Hkv, D] (strided view)
    k_cache: torch.Tensor  # [num_slots + 1, Hkv, D], NaN where unused
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float

    def clone_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache.clone(), self.v_cache.clone()


# name -> (uniform, causal). decode: 1 row each; verify: a causal W-token window; drafter: a
# non-causal gamma block; ragged: prefill from empty, chunked-prefill extends, decode rows
# and an idle request (extend 0) in one batch; mixed: a mixed step's forward, decode rows
# (1 token) or verify windows (W) first, then chunks longer than a query tile.
SCENARIOS: dict[str, tuple[bool, bool]] = {
    "decode": (True, True),
    "verify": (True, True),
    "drafter": (True, False),
    "ragged-causal": (False, True),
    "ragged-noncausal": (False, False),
    "mixed": (False, True),
}


def scenario_case(name: str, seed: int, max_len: int = 40, **kwargs) -> AttentionCase:
    """A random forward of one scenario; lengths are drawn from `seed` too (<= ~max_len)."""
    rng = random.Random(seed)
    uniform, causal = SCENARIOS[name]
    batch = rng.randint(3, 5)
    if name == "decode":
        extend = [1] * batch
        prefix = [rng.randint(0, max_len) for _ in range(batch)]
        prefix[rng.randrange(batch)] = 0  # a one-token prompt
    elif name == "mixed":
        rows = rng.randint(2, 5)
        window = rng.choice([1, rng.randint(2, 8)])  # plain decode rows or DSpark windows
        chunks = [rng.randint(max_len // 2, 2 * max_len), rng.randint(1, max_len)]
        extend = [window] * rows + chunks
        prefix = [rng.randint(1, 2 * max_len) for _ in range(rows)] + [0, rng.randint(1, max_len)]
    elif name in ("verify", "drafter"):
        window = rng.randint(2, 8)
        extend = [window] * batch
        prefix = [rng.randint(1, max_len) for _ in range(batch)]
    else:
        # prefill, chunked-prefill extend, decode, idle with and without keys, short prefill
        extend = [rng.randint(5, max_len), rng.randint(2, max_len // 2), 1, 0, 0, rng.randint(1, 9)]
        prefix = [0, rng.randint(1, max_len), rng.randint(1, max_len), rng.randint(1, 9), 0, 0]
        order = list(range(len(extend)))
        rng.shuffle(order)
        extend = [extend[i] for i in order]
        prefix = [prefix[i] for i in order]
    return make_case(seed, extend, prefix, causal=causal, uniform=uniform, **kwargs)


def make_case(
    seed: int,
    extend_lens: list[int],
    prefix_lens: list[int],
    num_q_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    page_size: int = 1,
    causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    skip_fraction: float = 0.2,
    uniform: bool = False,
    bound_slack: int = 3,
    shared_len: int = 0,
    sharing: list[bool] | None = None,
) -> AttentionCase:
    """One forward; `bound_slack` loosens the host bounds (max_seq_len, max_extend_len)
    beyond the true maxima, as a step-ahead host would. `shared_len` (a multiple of
    `page_size`): requests with `sharing[b]` (default: every request whose prefix holds
    that many keys) share the pages of their first `shared_len` positions."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(extend_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    max_seq = max(seq_lens + [1])
    max_ctx = max_seq + bound_slack + 5
    max_reqs = batch + 3

    pages_needed = sum(math.ceil(s / page_size) for s in seq_lens)
    num_pages = pages_needed + 3 + int(torch.randint(0, 4, (1,), generator=gen))
    num_slots = num_pages * page_size
    page_order = torch.randperm(num_pages, generator=gen).tolist()
    req_rows = torch.randperm(max_reqs, generator=gen)[:batch]
    # garbage everywhere a request does not use, including out-of-range ids
    req_to_token = torch.randint(-3, 2 * num_slots + 7, (max_reqs, max_ctx), generator=gen, dtype=torch.int32)
    assert shared_len % page_size == 0, "shared pages are whole pages"
    if sharing is None:
        sharing = [shared_len > 0 and p >= shared_len for p in prefix_lens]
    assert all(p >= shared_len for p, s in zip(prefix_lens, sharing, strict=True) if s)
    shared_pages = [page_order.pop() for _ in range(shared_len // page_size)] if any(sharing) else []
    for b, seq in enumerate(seq_lens):
        own = math.ceil(seq / page_size) - (len(shared_pages) if sharing[b] else 0)
        pages = (shared_pages if sharing[b] else []) + [page_order.pop() for _ in range(own)]
        positions = torch.arange(seq)
        slots = torch.tensor(pages, dtype=torch.int64)[positions // page_size] * page_size + positions % page_size
        req_to_token[req_rows[b], :seq] = slots.to(torch.int32)

    k_cache = torch.full((num_slots + 1, num_kv_heads, head_dim), float("nan"), dtype=torch.float32)
    v_cache = torch.full_like(k_cache, float("nan"))
    for b, seq in enumerate(seq_lens):  # every slot a request may attend holds finite (old) data
        used = req_to_token[req_rows[b], :seq].long()
        k_cache[used] = torch.randn(seq, num_kv_heads, head_dim, generator=gen)
        v_cache[used] = torch.randn(seq, num_kv_heads, head_dim, generator=gen)

    num_tokens = sum(extend_lens)
    q_start = torch.tensor([0] + extend_lens[:-1], dtype=torch.int64).cumsum(0)
    token_req = torch.repeat_interleave(torch.arange(batch), torch.tensor(extend_lens), output_size=num_tokens)
    token_offset = torch.arange(num_tokens) - q_start[token_req] if num_tokens else torch.zeros(0, dtype=torch.int64)
    token_prefix = torch.tensor(prefix_lens, dtype=torch.int64)[token_req]
    out_slots = req_to_token[req_rows[token_req], token_prefix + token_offset].long()
    skipped = torch.rand(num_tokens, generator=gen) < skip_fraction
    out_slots[skipped] = -1

    fused = torch.randn(num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    q, k, v = fused.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    q = q.reshape(num_tokens, num_q_heads, head_dim).contiguous()
    k = k.view(num_tokens, num_kv_heads, head_dim)
    v = v.view(num_tokens, num_kv_heads, head_dim)

    shared = None
    if shared_len > 0:
        spare_row = next(r for r in range(max_reqs) if r not in req_rows.tolist())
        if shared_pages:
            positions = torch.arange(shared_len)
            slots = torch.tensor(shared_pages, dtype=torch.int64)[positions // page_size] * page_size
            req_to_token[spare_row, :shared_len] = (slots + positions % page_size).to(torch.int32)
        lens = torch.tensor([shared_len if s else 0 for s in sharing], dtype=torch.int32)
        shared = SharedPrefix(
            lens=lens.to(device),
            length=torch.tensor([shared_len if shared_pages else 0], dtype=torch.int32, device=device),
            table_row=torch.tensor([spare_row], dtype=torch.int64, device=device),
            max_length=max_seq + bound_slack,
        )

    uniform_extend = None
    max_extend = max(extend_lens + [0])
    if uniform:
        assert len(set(extend_lens)) == 1, "uniform cases need equal extend lengths"
        uniform_extend = max_extend
    meta = AttentionMetadata(
        req_to_token=req_to_token.to(device),
        req_rows=req_rows.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int32, device=device),
        q_start=q_start.to(torch.int32).to(device),
        out_slots=out_slots.to(device),
        token_req=token_req.to(device),
        token_offset=token_offset.to(device),
        num_tokens=num_tokens,
        max_extend_len=max_extend if uniform else max_extend + bound_slack,
        max_seq_len=max_seq + bound_slack,
        causal=causal,
        uniform_extend=uniform_extend,
        shared=shared,
    )
    return AttentionCase(
        q=q.to(device, dtype),
        k=k.to(device, dtype),
        v=v.to(device, dtype),
        k_cache=k_cache.to(device, dtype),
        v_cache=v_cache.to(device, dtype),
        meta=meta,
        scale=1.0 / math.sqrt(head_dim),
    )


def stored_caches_float64(case: AttentionCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches after the forward's store, in float64 (the sink row is left as it was)."""
    k_cache = case.k_cache.double().cpu().clone()
    v_cache = case.v_cache.double().cpu().clone()
    slots = case.meta.out_slots.cpu()
    for t in range(case.meta.num_tokens):
        if slots[t] >= 0:
            k_cache[slots[t]] = case.k[t].double().cpu()
            v_cache[slots[t]] = case.v[t].double().cpu()
    return k_cache, v_cache


def reference_attention(case: AttentionCase) -> torch.Tensor:
    """[T, Hq, D] float64: store, then every query row softmax-attends its visible keys."""
    k_cache, v_cache = stored_caches_float64(case)
    meta = case.meta
    q = case.q.double().cpu()
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // k_cache.shape[1]
    out = torch.zeros(num_tokens, num_q_heads, head_dim, dtype=torch.float64)
    for b in range(meta.batch_size):
        seq = int(meta.seq_lens[b])
        ext = int(meta.extend_lens[b])
        first = int(meta.q_start[b])
        slots = meta.req_to_token[meta.req_rows[b], :seq].long().cpu()
        keys = k_cache[slots].repeat_interleave(group, dim=1)  # [seq, Hq, D]
        values = v_cache[slots].repeat_interleave(group, dim=1)
        for j in range(ext):
            visible = seq - ext + j + 1 if meta.causal else seq
            scores = torch.einsum("hd,khd->hk", q[first + j], keys[:visible]) * case.scale
            out[first + j] = torch.einsum("hk,khd->hd", scores.softmax(-1), values[:visible])
    return out


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"atol": 2e-5, "rtol": 2e-5}
    if dtype == torch.float16:
        return {"atol": 3e-3, "rtol": 3e-3}
    return {"atol": 2e-2, "rtol": 2e-2}


def mixed_parts(meta: AttentionMetadata, num_decode_reqs: int) -> AttentionMetadata:
    """`meta` of a mixed forward with its halves attached as concat_extend attaches them:
    the decode rows' uniform windows, then the chunks with their own row numbering."""
    n = int(meta.q_start[num_decode_reqs])
    width = int(meta.extend_lens[0])
    d = num_decode_reqs
    shared = meta.shared
    decode_rows = AttentionMetadata(
        meta.req_to_token, meta.req_rows[:d], meta.seq_lens[:d], meta.extend_lens[:d], meta.q_start[:d],
        meta.out_slots[:n], meta.token_req[:n], meta.token_offset[:n], n, width, meta.max_seq_len,
        uniform_extend=width, shared=None if shared is None else shared.rows(0, d),
    )  # fmt: skip
    chunks = AttentionMetadata(
        meta.req_to_token, meta.req_rows[d:], meta.seq_lens[d:], meta.extend_lens[d:], meta.q_start[d:] - n,
        meta.out_slots[n:], meta.token_req[n:] - d, meta.token_offset[n:], meta.num_tokens - n,
        meta.max_extend_len, meta.max_seq_len, shared=None if shared is None else shared.rows(d, meta.batch_size),
    )  # fmt: skip
    return dataclasses.replace(meta, parts=(decode_rows, chunks))
