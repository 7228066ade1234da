"""Paged attention through the compiled C kernel (engine/kernels/cpu/attention.c) on CPU.

It reads each key and value row in place through `req_to_token`, where the torch path
gathers a padded copy of every request's K/V per layer and then runs SDPA. It serves
forwards with a few query rows per request (decode, and DSpark's verify windows and drafter
blocks up to `MAX_EXTEND` rows); longer extends (prefill chunks) stay on the torch path,
whose SDPA tiles many rows better. bf16 and fp32 caches only.

Results agree with the torch reference, engine.kernels.attention.paged_attention_torch, to
rounding (fp32 softmax and accumulation in a different order; tests/attention/test_cpu_kernel.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.kernels.attention_metadata import AttentionMetadata
from engine.kernels.cpu.build import bind, load

# Longest extend the kernel serves; its tasks hold at most 8 query positions each, and past
# a DSpark window (gamma + 1 <= 8) SDPA over a padded gather is the faster of the two.
MAX_EXTEND = 8

_C_PTR, _C_INT64 = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [
    _C_PTR, _C_INT64, _C_INT64,  # q, its token and head strides
    _C_PTR, _C_PTR, _C_INT64, _C_INT64,  # k_cache, v_cache, their slot and head strides
    _C_PTR, _C_INT64,  # req_to_token, its row stride
    _C_PTR, _C_PTR, _C_PTR, _C_PTR,  # req_rows, seq_lens, extend_lens, q_start
    _C_INT64, _C_INT64, _C_INT64, _C_INT64, _C_INT64, _C_INT64,  # batch, Hq, Hkv, D, max_extend, kv_len
    ctypes.c_int, ctypes.c_float,  # causal, scale
    _C_PTR, _C_INT64, _C_INT64,  # out, its token and head strides
    _C_PTR, _C_INT64, ctypes.c_int,  # workspace, floats per thread, threads
]  # fmt: skip
_KERNELS = {torch.bfloat16: "paged_attention_bf16", torch.float32: "paged_attention_f32"}


class CpuPagedAttention:
    """The C kernel with its per-thread fp32 workspace (grow-only)."""

    def __init__(self) -> None:
        library = load("attention")
        self._functions: dict[torch.dtype, Callable[..., Any]] = {}
        self._workspace_floats: Callable[..., int] | None = None
        self._store_kv: Callable[..., None] | None = None
        self.uses_amx = False
        if library is not None:
            self._workspace_floats = bind(library, "workspace_floats", [_C_INT64] * 3, _C_INT64)
            # k, its token stride, v, its token stride, k_cache, v_cache, out_slots, T, Hkv * D, bytes
            self._store_kv = bind(
                library, "store_kv", [_C_PTR, _C_INT64, _C_PTR, _C_INT64] + [_C_PTR] * 3 + [_C_INT64] * 3
            )
            for dtype, name in _KERNELS.items():
                self._functions[dtype] = bind(library, name, _ARGTYPES)
            # bf16 tasks run on the AMX tiles where the CPU has them and Linux grants the state
            self.uses_amx = bool(bind(library, "attention_amx_init", [], ctypes.c_int)())
        self._workspace = torch.empty(0, dtype=torch.float32)
        self._args: _MetadataArgs | None = None  # of the current forward

    @property
    def built(self) -> bool:
        return bool(self._functions)

    def serves(self, q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> bool:
        return (
            q.is_cpu
            and q.dtype in self._functions
            and k_cache.dtype == q.dtype
            and meta.max_extend_len <= MAX_EXTEND
            and q.stride(-1) == 1
            and k_cache.is_contiguous()
        )

    def stores(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, out_slots: torch.Tensor) -> bool:
        """Whether `store_kv` takes these: the kernel built, CPU tensors, each token's [Hkv, D]
        block contiguous in k and v."""
        row_strides = (k_cache.shape[2], 1)
        return (
            self._store_kv is not None
            and k.is_cpu
            and k_cache.is_contiguous()
            and k.dtype == v.dtype == k_cache.dtype
            and k.stride()[1:] == row_strides
            and v.stride()[1:] == row_strides
            and out_slots.dtype == torch.int64
            and out_slots.is_contiguous()
        )

    def store_kv(
        self,
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D] contiguous
        v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D] contiguous
        out_slots: torch.Tensor,  # [T] int64; -1 skips the token
    ) -> None:
        assert self._store_kv is not None, "call stores() first"
        self._store_kv(
            k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
            out_slots.data_ptr(), k.shape[0], k.shape[1] * k.shape[2], k.element_size(),
        )  # fmt: skip

    def __call__(
        self,
        q: torch.Tensor,  # [T, Hq, D], rows contiguous
        k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D] contiguous
        v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D] contiguous
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,  # [T, Hq, D], rows contiguous
    ) -> torch.Tensor:
        num_tokens, num_q_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[1]
        if num_tokens == 0 or meta.batch_size == 0:
            return out
        threads = torch.get_num_threads()
        args = self.prepare(meta, num_q_heads // num_kv_heads, head_dim, threads)
        table, req_rows, seq_lens, extend_lens, q_start = args.tensors
        kv_len, per_thread = args.kv_len, args.floats_per_thread
        self._functions[q.dtype](
            q.data_ptr(), q.stride(0), q.stride(1),
            k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1),
            table.data_ptr(), table.stride(0),
            req_rows.data_ptr(), seq_lens.data_ptr(), extend_lens.data_ptr(), q_start.data_ptr(),
            meta.batch_size, num_q_heads, num_kv_heads, head_dim, meta.max_extend_len, kv_len,
            int(meta.causal), scale,
            out.data_ptr(), out.stride(0), out.stride(1),
            self._workspace.data_ptr(), per_thread, threads,
        )  # fmt: skip
        return out

    def prepare(self, meta: AttentionMetadata, group: int, head_dim: int, threads: int) -> _MetadataArgs:
        """The kernel's arguments for `meta`, with the workspace grown for `threads` threads
        (`self.workspace`)."""
        args = self._metadata_args(meta, group, head_dim)
        if self._workspace.numel() < threads * args.floats_per_thread:
            self._workspace = torch.empty(threads * args.floats_per_thread, dtype=torch.float32)
        return args

    @property
    def workspace(self) -> torch.Tensor:
        return self._workspace

    def _metadata_args(self, meta: AttentionMetadata, group: int, head_dim: int) -> _MetadataArgs:
        """The kernel's view of `meta`, made at the forward's first layer and reused by the
        others (every layer passes the same metadata object, which is not rewritten meanwhile:
        the torch path's AttentionPlan relies on the same)."""
        args = self._args
        if args is None or args.meta is not meta or args.shape != (group, head_dim):
            assert self._workspace_floats is not None, "call serves() first"
            kv_len = max(1, min(meta.max_seq_len, meta.req_to_token.shape[1]))
            args = self._args = _MetadataArgs(
                meta=meta,
                shape=(group, head_dim),
                tensors=(
                    _as(meta.req_to_token, torch.int32),
                    _as(meta.req_rows, torch.int64),
                    _as(meta.seq_lens, torch.int32),
                    _as(meta.extend_lens, torch.int32),
                    _as(meta.q_start, torch.int32),
                ),  # fmt: skip
                kv_len=kv_len,
                floats_per_thread=int(self._workspace_floats(kv_len, group, head_dim)),
            )
        return args


@dataclass
class _MetadataArgs:
    meta: AttentionMetadata
    shape: tuple[int, int]  # (query heads per kv head, head_dim) the workspace size is for
    # req_to_token, req_rows, seq_lens, extend_lens, q_start in the kernel's int types
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    kv_len: int  # the host's bound on seq_lens, at most the table's width
    floats_per_thread: int


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` with contiguous rows of `dtype` (a copy only when it is not already)."""
    t = t.to(dtype)
    return t if t.stride(-1) == 1 else t.contiguous()
