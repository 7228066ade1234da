"""AttentionBackend in plain torch: the production path on CPU, and a reference anywhere.

It stores the new K/V, then attends with the C kernel of engine.kernels.cpu.attention (CPU
forwards of a few query rows per request) or the torch reference of engine.kernels.attention,
planning that once per forward on CPU. A mixed step's forward is attended as its two parts
(AttentionMetadata.parts), each on its own path: its decode rows by the C kernel, its chunks
by the torch reference, so that no decode row is padded to a chunk's length.
"""

from __future__ import annotations

import torch

from engine.kernels.attention import DEFAULT_CHUNK_BYTES, AttentionPlan, Workspace, check_shapes, paged_attention_torch
from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.cpu.attention import CpuPagedAttention
from engine.kernels.store_kv import store_kv_torch


class TorchAttentionBackend:
    """AttentionBackend in plain torch (any device; the production path on CPU), which on CPU
    hands forwards of a few query rows per request (decode, DSpark windows) to the compiled
    kernel of engine.kernels.cpu.attention when it is built (`cpu_kernel=False`: never).

    Every layer of a forward passes the same metadata object, so on CPU the plan of the
    first call (one per part of a mixed forward) serves the layers after it. The metadata's
    tensors must then stay as they are until a new metadata object comes: every runner builds
    one per forward. Other devices plan on every call, since a CUDA graph may be captured over
    metadata whose tensors are rewritten in place between replays."""

    name = "torch"

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES, cpu_kernel: bool = True) -> None:
        self.chunk_bytes = chunk_bytes
        self.use_cpu_kernel = cpu_kernel
        self._cpu_kernel: CpuPagedAttention | None = None  # built at the first CPU forward
        self.workspace = Workspace()
        # The current forward's metadata and its plans (CPU only), by id of the metadata object
        # each serves: the forward's own, or one per part of a mixed forward. Holding the
        # forward's metadata keeps those ids from being reused while the plans live.
        self._forward: AttentionMetadata | None = None
        self._plans: dict[int, AttentionPlan] = {}

    def plan_for(self, meta: AttentionMetadata) -> AttentionPlan | None:
        """The current forward's plan for `meta` (the forward's, or one of its parts), if any."""
        plan = self._plans.get(id(meta))
        return plan if plan is not None and plan.meta is meta else None

    @property
    def cpu_kernel(self) -> CpuPagedAttention | None:
        """The C kernel once the first CPU forward built it (None before, and when it is off)."""
        return self._cpu_kernel

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
        kernel = self._cpu_kernel
        if kernel is None and self.use_cpu_kernel and q.device.type == "cpu":
            kernel = self._cpu_kernel = CpuPagedAttention()
        if kernel is not None and kernel.stores(k, v, k_cache, meta.out_slots):
            kernel.store_kv(k, v, k_cache, v_cache, meta.out_slots)
        else:
            store_kv_torch(k, v, k_cache, v_cache, meta.out_slots)
        if meta is not self._forward:
            self._forward, self._plans = meta, {}
        if meta.parts is None:
            return self._attend(q, k_cache, v_cache, meta, scale, out)
        out = torch.empty_like(q) if out is None else out
        first = 0
        for part in meta.parts:  # [decode rows | chunks], rows laid in that order
            end = first + part.num_tokens
            if end > first:
                self._attend(q[first:end], k_cache, v_cache, part, scale, out[first:end])
            first = end
        return out

    def _attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention of q's rows over the cache (K/V already stored): the C kernel where it
        serves, else the torch reference with this forward's plan for `meta`."""
        kernel = self._cpu_kernel
        if kernel is not None and kernel.serves(q, k_cache, meta):
            check_shapes(q, k_cache, meta)
            return kernel(q, k_cache, v_cache, meta, scale, torch.empty_like(q) if out is None else out)
        plan = None
        if q.device.type == "cpu":
            plan = self._plans.get(id(meta))
            if plan is None or not plan.serves(q, k_cache, meta):
                check_shapes(q, k_cache, meta)
                plan = self._plans[id(meta)] = AttentionPlan(q, k_cache, meta, self.chunk_bytes, self.workspace)
        return paged_attention_torch(
            q, k_cache, v_cache, meta, scale, out=out, chunk_bytes=self.chunk_bytes, workspace=self.workspace,
            plan=plan,
        )  # fmt: skip
