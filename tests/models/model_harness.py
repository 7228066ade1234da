"""Drive a model without the engine: a dense KV cache, metadata for a batch of requests, a
small dense attention reference, and a greedy prefill-then-decode loop.

Request r owns slots `[r * max_ctx, (r + 1) * max_ctx)`; the host loops freely here (this
is test code, not the hot path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.kernels.attention_metadata import AttentionMetadata
from engine.models.context import ForwardContext


class DenseKVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_reqs: int,
        max_ctx: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        self.max_ctx = max_ctx
        num_slots = max_reqs * max_ctx
        shape = (num_slots + 1, num_kv_heads, head_dim)  # the last row is the write sink
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        slots = torch.arange(num_slots, dtype=torch.int32, device=device)
        self.req_to_token = slots.view(max_reqs, max_ctx)

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer_id], self.v[layer_id]


class DenseTestBackend:
    """Causal attention per request in float32 with GQA by repeating K/V heads."""

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, out=None) -> torch.Tensor:
        k_cache[meta.out_slots] = k.to(k_cache.dtype)  # slot -1 lands in the sink row
        v_cache[meta.out_slots] = v.to(v_cache.dtype)
        out = torch.empty_like(q) if out is None else out
        group = q.shape[1] // k_cache.shape[1]
        for b in range(meta.batch_size):
            row, seq_len = int(meta.req_rows[b]), int(meta.seq_lens[b])
            extend, start = int(meta.extend_lens[b]), int(meta.q_start[b])
            slots = meta.req_to_token[row, :seq_len].long()
            keys = k_cache[slots].float().repeat_interleave(group, dim=1)  # [S, Hq, D]
            values = v_cache[slots].float().repeat_interleave(group, dim=1)
            queries = q[start : start + extend].float()  # [E, Hq, D]
            scores = torch.einsum("ehd,shd->hes", queries, keys) * scale
            if meta.causal:
                last_key = seq_len - extend + torch.arange(extend)
                hidden_keys = torch.arange(seq_len)[None, :] > last_key[:, None]  # [E, S]
                scores = scores.masked_fill(hidden_keys, float("-inf"))
            probs = scores.softmax(dim=-1)
            out[start : start + extend] = torch.einsum("hes,shd->ehd", probs, values).to(q.dtype)
        return out


def default_backend() -> object:
    from engine.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


def make_metadata(
    cache: DenseKVCache, req_rows: Sequence[int], prefix_lens: Sequence[int], extend_lens: Sequence[int]
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata for one forward, and the positions [T] of its tokens."""
    device = cache.req_to_token.device
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    q_start = [sum(extend_lens[:b]) for b in range(len(extend_lens))]
    token_req = [b for b, e in enumerate(extend_lens) for _ in range(e)]
    token_offset = [j for e in extend_lens for j in range(e)]
    positions = [prefix_lens[b] + j for b, j in zip(token_req, token_offset, strict=True)]
    out_slots = [int(cache.req_to_token[req_rows[b], p]) for b, p in zip(token_req, positions, strict=True)]

    def tensor(values: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(list(values), dtype=dtype, device=device)

    meta = AttentionMetadata(
        req_to_token=cache.req_to_token,
        req_rows=tensor(req_rows, torch.int64),
        seq_lens=tensor(seq_lens, torch.int32),
        extend_lens=tensor(extend_lens, torch.int32),
        q_start=tensor(q_start, torch.int32),
        out_slots=tensor(out_slots, torch.int64),
        token_req=tensor(token_req, torch.int64),
        token_offset=tensor(token_offset, torch.int64),
        num_tokens=len(token_req),
        max_extend_len=max(extend_lens),
        max_seq_len=max(seq_lens),
    )
    return meta, tensor(positions, torch.int64)


@dataclass
class Generation:
    tokens: list[int]  # the new tokens
    logits: list[torch.Tensor] = field(default_factory=list)  # [V] float32 before each new token


def make_cache(model: torch.nn.Module, max_reqs: int, max_ctx: int) -> DenseKVCache:
    attn = model.model.layers[0].self_attn
    param = next(model.parameters())
    return DenseKVCache(
        len(model.model.layers),
        attn.num_kv_heads,
        attn.head_dim,
        max_reqs,
        max_ctx,
        param.dtype,
        param.device,
    )


@torch.inference_mode()
def greedy_generate(
    model: torch.nn.Module,
    prompt: Sequence[int],
    max_new_tokens: int,
    backend: object | None = None,
    prefill_chunk: int | None = None,
) -> Generation:
    """Batch-1 greedy decoding with a KV cache: prefill (in chunks if asked), then one token
    per forward."""
    backend = backend or default_backend()
    cache = make_cache(model, 1, len(prompt) + max_new_tokens + 1)
    device = cache.req_to_token.device
    out = Generation(tokens=[])
    pending, done = list(prompt), 0
    while len(out.tokens) < max_new_tokens:
        chunk = pending if prefill_chunk is None else pending[:prefill_chunk]
        meta, positions = make_metadata(cache, [0], [done], [len(chunk)])
        ctx = ForwardContext(meta=meta, kv=cache, backend=backend)  # type: ignore[arg-type]
        hidden = model(torch.tensor(chunk, dtype=torch.int64, device=device), positions, ctx)
        done += len(chunk)
        pending = pending[len(chunk) :]
        if pending:
            continue
        logits = model.compute_logits(hidden[-1:])[0].cpu()
        token = int(logits.argmax())
        out.logits.append(logits)
        out.tokens.append(token)
        pending = [token]
    return out


def last_logits(model: torch.nn.Module, sequences: list[list[int]]) -> torch.Tensor:
    """[S, V] logits of the last position of each sequence, each from one full forward
    over a dense cache: the reference the engine's incremental steps are checked against."""
    from engine.models.context import ForwardContext

    rows = []
    for seq in sequences:
        attn = model.model.layers[0].self_attn
        cache = DenseKVCache(len(model.model.layers), attn.num_kv_heads, attn.head_dim, 1, len(seq) + 1)
        meta, positions = make_metadata(cache, [0], [0], [len(seq)])
        hidden = model(torch.tensor(seq), positions, ForwardContext(meta=meta, kv=cache, backend=DenseTestBackend()))
        rows.append(model.compute_logits(hidden[-1:])[0])
    return torch.stack(rows)


def sequence_logits(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """[len, V] logits of every position of `sequence` from one full forward over a dense
    cache (no chunks, no prefix cache): the reference of prompt logprobs."""
    from engine.models.context import ForwardContext

    attn = model.model.layers[0].self_attn
    param = next(model.parameters())
    cache = DenseKVCache(len(model.model.layers), attn.num_kv_heads, attn.head_dim, 1, len(sequence) + 1, param.dtype)
    meta, positions = make_metadata(cache, [0], [0], [len(sequence)])
    ctx = ForwardContext(meta=meta, kv=cache, backend=DenseTestBackend())  # type: ignore[arg-type]
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(sequence), positions, ctx))
