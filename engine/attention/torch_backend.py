"""AttentionBackend in plain torch: the production path on CPU, and a reference anywhere.

It stores the new K/V, then attends with the C kernel of engine.kernels.cpu.attention (CPU
forwards of a few query rows per request) or the torch reference of engine.kernels.attention,
planning that once per forward on CPU.
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
    first call serves the layers after it. The metadata's tensors must then stay as they are
    until a new metadata object comes: every runner builds one per forward. Other devices plan
    on every call, since a CUDA graph may be captured over metadata whose tensors are
    rewritten in place between replays."""

    name = "torch"

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES, cpu_kernel: bool = True) -> None:
        self.chunk_bytes = chunk_bytes
        self.use_cpu_kernel = cpu_kernel
        self._cpu_kernel: CpuPagedAttention | None = None  # built at the first CPU forward
        self.workspace = Workspace()
        self._plan: AttentionPlan | None = None  # the current forward's (CPU only)

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
        if kernel is not None and kernel.serves(q, k_cache, meta):
            check_shapes(q, k_cache, meta)
            if kernel.stores(k, v, k_cache, meta.out_slots):
                kernel.store_kv(k, v, k_cache, v_cache, meta.out_slots)
            else:
                store_kv_torch(k, v, k_cache, v_cache, meta.out_slots)
            return kernel(q, k_cache, v_cache, meta, scale, torch.empty_like(q) if out is None else out)
        store_kv_torch(k, v, k_cache, v_cache, meta.out_slots)
        plan = None
        if q.device.type == "cpu":
            if self._plan is None or not self._plan.serves(q, k_cache, meta):
                check_shapes(q, k_cache, meta)
                self._plan = AttentionPlan(q, k_cache, meta, self.chunk_bytes, self.workspace)
            plan = self._plan
        return paged_attention_torch(
            q, k_cache, v_cache, meta, scale, out=out, chunk_bytes=self.chunk_bytes, workspace=self.workspace,
            plan=plan,
        )  # fmt: skip
