"""Triton kernel for `engine.sampling.rng.uniform`: the same Philox-4x32-10 words and the
same float conversion, bit for bit, in one pass. Its reference is the torch path of
engine/sampling/rng.py, which calls it on CUDA tensors; tests/sampling/test_sampling_rng.py
compares the two in the interpreter. Nothing here imports the sampler."""

from __future__ import annotations

import torch

from engine.kernels.triton.launch import available, jit_on_first_use, tl, triton

__all__ = ["available", "uniform"]

_BLOCK = 256  # Philox blocks per program: 1024 output columns


def _philox_uniform_kernel(
    key_ptr,  # [B] int64
    counter_ptr,  # [B] int64
    out_ptr,  # [B, n_cols] float32, row stride out_stride
    n_cols,
    out_stride,
    stream,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    blocks = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(key_ptr + row).to(tl.uint64, bitcast=True)
    counter = tl.load(counter_ptr + row).to(tl.uint64, bitcast=True)
    zeros = tl.full([BLOCK], 0, dtype=tl.uint32)  # tl.zeros is @jit: unusable in a late interpreter
    k0 = (key & 0xFFFFFFFF).to(tl.uint32)
    k1 = (key >> 32).to(tl.uint32)
    c0 = blocks.to(tl.uint32)
    c1 = zeros + (counter & 0xFFFFFFFF).to(tl.uint32)
    c2 = zeros + (counter >> 32).to(tl.uint32)
    c3 = (zeros + stream).to(tl.uint32)
    for round_index in tl.static_range(10):
        if round_index > 0:
            k0 = k0 + 0x9E3779B9
            k1 = k1 + 0xBB67AE85
        prev_c0 = c0
        prev_c2 = c2
        c0 = tl.umulhi(prev_c2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.umulhi(prev_c0, 0xD2511F53) ^ c3 ^ k1
        c1 = prev_c2 * 0xCD9E8D57
        c3 = prev_c0 * 0xD2511F53
    base = out_ptr + row.to(tl.int64) * out_stride + blocks.to(tl.int64) * 4
    columns = blocks * 4
    scale = 1.1920928955078125e-07  # 2^-23
    tl.store(base, ((c0 >> 9).to(tl.float32) + 0.5) * scale, mask=columns < n_cols)
    tl.store(base + 1, ((c1 >> 9).to(tl.float32) + 0.5) * scale, mask=columns + 1 < n_cols)
    tl.store(base + 2, ((c2 >> 9).to(tl.float32) + 0.5) * scale, mask=columns + 2 < n_cols)
    tl.store(base + 3, ((c3 >> 9).to(tl.float32) + 0.5) * scale, mask=columns + 3 < n_cols)


_compiled = jit_on_first_use(_philox_uniform_kernel, do_not_specialize=["stream"])


def uniform(key: torch.Tensor, counter: torch.Tensor, n: int, stream: int) -> torch.Tensor:
    """[B, n] float32 in (0, 1), identical to the torch path of `rng.uniform`."""
    batch = key.shape[0]
    out = torch.empty(batch, n, dtype=torch.float32, device=key.device)
    if batch == 0 or n == 0:
        return out
    grid = (batch, triton.cdiv(triton.cdiv(n, 4), _BLOCK))
    _compiled()[grid](
        key.to(torch.int64).contiguous(),
        counter.to(torch.int64).contiguous(),
        out,
        n,
        out.stride(0),
        stream,
        BLOCK=_BLOCK,
    )
    return out
