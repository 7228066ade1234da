"""Prefill and mixed forwards replayed as CUDA (HIP) graphs in pieces, cut at attention
(docs/design.md §4.8).

A forward that carries prefill chunks has a ragged attention whose metadata changes every
step, but everything else in it (embedding, norms, projections, RoPE, SwiGLU, the residual
captures DSpark reads) depends only on the token count T. So the target's forward is
captured once per token-count bucket as L + 1 graphs cut at its L attention calls: piece 0
runs up to layer 0's attention inputs, piece l from layer l-1's attention output to layer
l's attention inputs, piece L to the final norm. Replay runs piece l, then layer l's
attention eagerly on the step's own metadata, then piece l + 1: the host launches L + 1
graphs and the attention kernels instead of every kernel of the forward.

Static buffers, shared by every bucket and layer (one piece runs at a time, in order):
- ids, positions [max T]: the forward's inputs; rows past T keep stale in-range values;
- q [max T, Hq, D], k / v [max T, Hkv, D]: the attention inputs a piece leaves (after RoPE);
- attn [max T, Hq, D]: the attention output the next piece reads;
- hidden [max T, H] and one [max T, H] per captured layer: the forward's outputs.
Rows past T compute values nothing reads: outside attention every operation is row-wise.
"""

from __future__ import annotations

import torch

from engine.models.context import CausalLM, LayerContext

# Token counts captured: fine steps where mixed steps of a few hundred tokens land, coarser above.
EXTEND_BUCKETS = (16, 32, 48, 64, 96, 128, *range(192, 1025, 64), *range(1280, 8193, 256))


class _Buffers:
    """The static tensors of every capture; made by the first (largest) warm-up."""

    def __init__(self, max_tokens: int, device: torch.device) -> None:
        self.max_tokens = max_tokens
        self.ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.qkv: list[torch.Tensor] = []  # q, k, v
        self.attn: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        self.aux: list[torch.Tensor] = []

    def attention_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy a layer's attention inputs in (allocating the buffers on the first call)."""
        if not self.qkv:
            self.qkv = [torch.zeros(self.max_tokens, *t.shape[1:], dtype=t.dtype, device=t.device) for t in (q, k, v)]
            self.attn = torch.zeros_like(self.qkv[0])
        tokens = q.shape[0]
        for static, value in zip(self.qkv, (q, k, v), strict=True):
            static[:tokens].copy_(value)

    def outputs(self, hidden: torch.Tensor, captured: list[torch.Tensor]) -> None:
        if self.hidden is None:
            self.hidden = torch.zeros(self.max_tokens, *hidden.shape[1:], dtype=hidden.dtype, device=hidden.device)
            self.aux = [torch.zeros_like(self.hidden) for _ in captured]
        tokens = hidden.shape[0]
        self.hidden[:tokens].copy_(hidden)
        for static, value in zip(self.aux, captured, strict=True):
            static[:tokens].copy_(value)


class _PieceCutter:
    """The LayerContext of a warm-up or a capture. Each attention call copies the layer's
    inputs into the static buffers and hands back the static output; while capturing it also
    ends the graph of the piece before it and begins the next one."""

    def __init__(
        self,
        buffers: _Buffers,
        tokens: int,
        capture_layers: tuple[int, ...],
        pool: torch.cuda._POOL_HANDLE | None,  # the graphs' memory pool; None: a warm-up
    ) -> None:
        self.buffers = buffers
        self.tokens = tokens
        self.capture_layers = capture_layers
        self.captured: list[torch.Tensor] = []
        self.pool = pool
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.scales: list[float] = []
        self._graph: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        if self.pool is not None:
            self._graph = torch.cuda.CUDAGraph()
            self._graph.capture_begin(pool=self.pool)

    def end(self) -> None:
        if self._graph is not None:
            self._graph.capture_end()
            self.graphs.append(self._graph)
            self._graph = None

    def attention(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,  # unused: the piece hands back the static output
    ) -> torch.Tensor:
        if layer_id != len(self.scales):
            raise RuntimeError(f"piecewise capture: layer {layer_id} attended out of order")
        self.buffers.attention_inputs(q, k, v)
        self.scales.append(scale)
        self.end()
        self.begin()
        assert self.buffers.attn is not None
        return self.buffers.attn[: self.tokens]


class PiecewiseForward:
    """Runs `model`'s forward for T ≤ max_tokens tokens from the smallest bucket ≥ T (GPU only)."""

    def __init__(
        self,
        model: CausalLM,
        capture_layers: tuple[int, ...],
        max_tokens: int,
        device: torch.device,
        buckets: tuple[int, ...] = EXTEND_BUCKETS,
    ) -> None:
        self.buckets = (*(b for b in buckets if b < max_tokens), max_tokens)
        self.buffers = _Buffers(max_tokens, device)
        self._pieces: dict[int, tuple[list[torch.cuda.CUDAGraph], list[float]]] = {}
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for tokens in reversed(self.buckets):  # largest first: the others reuse its pool
                self._run_model(model, _PieceCutter(self.buffers, tokens, capture_layers, None))
                cutter = _PieceCutter(self.buffers, tokens, capture_layers, pool)
                self._run_model(model, cutter)
                self._pieces[tokens] = (cutter.graphs, cutter.scales)
        torch.cuda.current_stream(device).wait_stream(stream)

    def _run_model(self, model: CausalLM, cutter: _PieceCutter) -> None:
        tokens = cutter.tokens
        cutter.begin()
        hidden = model(self.buffers.ids[:tokens], self.buffers.positions[:tokens], cutter)
        self.buffers.outputs(hidden, cutter.captured)
        cutter.end()

    def bucket_for(self, tokens: int) -> int | None:
        return next((b for b in self.buckets if b >= tokens), None)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """input_ids [T], positions [T] -> final hidden states [T, H], a view of the static
        output that the next forward overwrites; fills ctx.captured likewise."""
        tokens = input_ids.shape[0]
        bucket = self.bucket_for(tokens)
        assert bucket is not None, "the caller checks bucket_for"
        buffers = self.buffers
        assert buffers.qkv and buffers.attn is not None and buffers.hidden is not None
        buffers.ids[:tokens].copy_(input_ids)
        buffers.positions[:tokens].copy_(positions)
        graphs, scales = self._pieces[bucket]
        # One set of views for every layer: the backend prepares its launches at layer 0 and
        # reuses them for the layers after it when they pass these same tensors.
        q, k, v = (t[:tokens] for t in buffers.qkv)
        attn = buffers.attn[:tokens]
        for layer_id, scale in enumerate(scales):
            graphs[layer_id].replay()
            ctx.attention(layer_id, q, k, v, scale, out=attn)
        graphs[-1].replay()
        ctx.captured.extend(aux[:tokens] for aux in buffers.aux)
        return buffers.hidden[:tokens]
