"""Triton kernel of a linear layer over a few rows (decode at small batch): y = x W^T + b,
optionally with SwiGLU applied to a [gate | up] weight's two halves in the same pass.

At a handful of rows a linear is a stream of its weight: every weight byte is read once and
used for M multiply-adds, so the kernel's only job is to keep the memory system busy. Each
program owns BLOCK_N output features, walks the whole of K in BLOCK_K chunks (no split of K,
so no partial sums to reduce in a second launch); at one or two rows it keeps a
[M_PAD, BLOCK_N, BLOCK_K] fp32 accumulator reduced over K once at the end, at more rows
(whose registers that would exhaust) it reduces every step. The gated form computes the gate
and up features n and I + n in the same program and writes silu(gate) * up, so the [M, 2I]
intermediate and the separate SwiGLU launch disappear. The norm form takes the pre-norm
decoder layer's RMSNorm (with the residual add before it) into the same launch: every
program reads the input rows whole once for their statistics, then normalises each K chunk
as it multiplies it (docs/design.md §2.10).

Roundings follow the unfused path (F.linear, then silu_and_mul; the RMSNorm kernel): the
sums, plus bias, are rounded to the activation dtype; silu is taken of the rounded gate and
rounded again before the product. The sums themselves run in another order than a cuBLAS
kernel's, so results match F.linear to fp32 accumulation error, not bit for bit
(tests/kernels/triton/skinny_linear_cases.py compares). benchmarks/skinny_linear_sweep.py
times it against cuBLAS; docs/design.md §2.10 says when the engine's linears take it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels.triton.launch import check_last_dim_contiguous, jit_on_first_use, require_triton, tl, triton


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch configuration: output features per program, K per loop step, warps."""

    block_n: int
    block_k: int
    num_warps: int
    wide_acc: bool  # reduce over K once at the end (few rows) or every step (more rows)


def _skinny_linear_kernel(
    x_ptr,  # [M, K], last dim contiguous
    w_ptr,  # [N, K] (gated: [2I, K] laid [gate | up]), last dim contiguous
    bias_ptr,  # [N] or a dummy when HAS_BIAS is false
    out_ptr,  # [M, N_OUT] contiguous; N_OUT = N, or I when gated
    residual_ptr,  # [M, K], last dim contiguous; read with NORM and HAS_RESIDUAL
    residual_out_ptr,  # [M, K] contiguous: x + residual, written by program 0
    norm_w_ptr,  # [K]: the RMSNorm weight; read with NORM
    M,
    N_OUT,
    K,
    stride_xm,
    stride_rm,
    stride_wn,
    eps,
    M_PAD: tl.constexpr,  # next power of two >= M
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    WIDE_ACC: tl.constexpr,  # keep [M_PAD, BLOCK_N, BLOCK_K] partial sums, reduce once at the end
    NORM: tl.constexpr,  # the input is RMSNorm(x [+ residual]), computed here
    HAS_RESIDUAL: tl.constexpr,
    K_PAD: tl.constexpr,  # next power of two >= K: the norm's statistics read whole rows
):
    pid = tl.program_id(0)
    rows = tl.arange(0, M_PAD)
    features = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    feature_ok = features < N_OUT
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_xm  # [M_PAD, 1]
    w_rows = w_ptr + features[:, None].to(tl.int64) * stride_wn  # [BLOCK_N, 1]
    up_rows = w_rows + N_OUT.to(tl.int64) * stride_wn  # gated: the up half's rows
    res_rows = residual_ptr + rows[:, None].to(tl.int64) * stride_rm  # [M_PAD, 1]
    dtype = out_ptr.dtype.element_ty
    if NORM:
        # Every program takes the rows' statistics itself (the rows sit in L2 after the first);
        # program 0 also writes the residual stream x + residual the layer carries on.
        cols = tl.arange(0, K_PAD)
        row_mask = (rows[:, None] < M) & (cols[None, :] < K)
        stream = tl.load(x_rows + cols[None, :], mask=row_mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            stream += tl.load(res_rows + cols[None, :], mask=row_mask, other=0.0).to(tl.float32)
            stream = stream.to(dtype).to(tl.float32)
            if pid == 0:
                out_rows = residual_out_ptr + rows[:, None] * K + cols[None, :]
                tl.store(out_rows, stream.to(dtype), mask=row_mask)
        rstd = tl.math.rsqrt(tl.sum(stream * stream, axis=1) / K + eps)  # [M_PAD]
    if WIDE_ACC:
        acc = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_up = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        if EVEN_K:
            x_mask = rows[:, None] < M
            w_mask = feature_ok[:, None]
        else:
            x_mask = (rows[:, None] < M) & (k[None, :] < K)
            w_mask = feature_ok[:, None] & (k[None, :] < K)
        x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0).to(tl.float32)  # [M_PAD, BLOCK_K]
        if NORM:  # as the RMSNorm kernel rounds: the sum, the normalised value, the weighted one
            if HAS_RESIDUAL:
                x += tl.load(res_rows + k[None, :], mask=x_mask, other=0.0).to(tl.float32)
                x = x.to(dtype).to(tl.float32)
            norm_w = tl.load(norm_w_ptr + k, mask=k < K, other=0.0).to(tl.float32)
            x = (norm_w[None, :] * (x * rstd[:, None]).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first")
        if WIDE_ACC:
            acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
        else:
            acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        if GATED:
            u = tl.load(up_rows + k[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first")
            if WIDE_ACC:
                acc_up += x[:, None, :] * u.to(tl.float32)[None, :, :]
            else:
                acc_up += tl.sum(x[:, None, :] * u.to(tl.float32)[None, :, :], axis=2)
    if WIDE_ACC:
        y = tl.sum(acc, axis=2)  # [M_PAD, BLOCK_N]
        up = tl.sum(acc_up, axis=2)
    else:
        y = acc
        up = acc_up
    if HAS_BIAS:
        y += tl.load(bias_ptr + features, mask=feature_ok, other=0.0).to(tl.float32)[None, :]
    y = y.to(dtype).to(tl.float32)
    if GATED:
        if HAS_BIAS:
            up += tl.load(bias_ptr + N_OUT + features, mask=feature_ok, other=0.0).to(tl.float32)[None, :]
        up = up.to(dtype).to(tl.float32)
        y = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32) * up
    out = out_ptr + rows[:, None] * N_OUT + features[None, :]
    tl.store(out, y.to(dtype), mask=(rows[:, None] < M) & feature_ok[None, :])


_compiled = jit_on_first_use(_skinny_linear_kernel)


@dataclass(frozen=True)
class RowNorm:
    """RMSNorm of the input rows, applied inside the linear (engine/kernels/norm.py's rounding):
    rms_norm(x + residual) with `weight` [K], or rms_norm(x) without a residual."""

    weight: torch.Tensor  # [K]
    eps: float
    residual: torch.Tensor | None  # x's shape and dtype: the layer's residual stream


def skinny_linear_triton(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K]; gated: [2I, K] laid [gate | up]
    bias: torch.Tensor | None = None,  # [N]
    gated: bool = False,
    config: SkinnyConfig | None = None,
) -> torch.Tensor:  # [..., N], or [..., I] when gated
    """x W^T + b (gated: silu(gate) * up) as one launch of cdiv(N_OUT, block_n) programs;
    graph-capturable. `config` overrides the default launch shape (benchmarks sweep it)."""
    return _launch(x, weight, bias, gated, config, None)[0]


def skinny_norm_linear_triton(
    x: torch.Tensor,  # [..., K]
    norm: RowNorm,
    weight: torch.Tensor,  # [N, K]; gated: [2I, K] laid [gate | up]
    bias: torch.Tensor | None = None,
    gated: bool = False,
    config: SkinnyConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([..., N or I], the residual stream [..., K])
    """(linear(rms_norm(x + residual)), x + residual) in one launch: the pre-norm decoder
    layer's norm and the projection after it. Without a residual the stream is x itself."""
    y, stream = _launch(x, weight, bias, gated, config, norm)
    return y, x if stream is None else stream


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gated: bool,
    config: SkinnyConfig | None,
    norm: RowNorm | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    require_triton("skinny_linear_triton")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"skinny_linear: x has {x.shape[-1]} features, weight expects {k}")
    if gated and n % 2:
        raise ValueError(f"skinny_linear: a gated weight has an even row count ([gate | up]), got {n}")
    rows = x.reshape(-1, k)
    check_last_dim_contiguous("skinny_linear", x=rows, weight=weight)
    residual = norm.residual if norm is not None else None
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"skinny_linear: residual {tuple(residual.shape)} {residual.dtype} must match x's")
    if norm is not None and norm.weight.shape != (k,):
        raise ValueError(f"skinny_linear: norm weight has shape {tuple(norm.weight.shape)}, rows have {k}")
    res_rows = residual.reshape(-1, k) if residual is not None else rows
    check_last_dim_contiguous("skinny_linear", residual=res_rows)
    n_out = n // 2 if gated else n
    out = torch.empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    stream = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    m = rows.shape[0]
    if m == 0 or n_out == 0:
        return out, stream
    config = config or default_config(m, n_out, k, normed=norm is not None)
    block_k = min(config.block_k, triton.next_power_of_2(k))
    _compiled()[(triton.cdiv(n_out, config.block_n),)](
        rows,
        weight,
        bias if bias is not None else weight,
        out,
        res_rows,
        stream if stream is not None else out,
        norm.weight if norm is not None else weight,
        m,
        n_out,
        k,
        rows.stride(0),
        res_rows.stride(0),
        weight.stride(0),
        norm.eps if norm is not None else 0.0,
        M_PAD=triton.next_power_of_2(m),
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        HAS_BIAS=bias is not None,
        GATED=gated,
        WIDE_ACC=config.wide_acc,
        NORM=norm is not None,
        HAS_RESIDUAL=residual is not None,
        K_PAD=triton.next_power_of_2(k),
        num_warps=config.num_warps,
    )
    return out, stream


def default_config(rows: int, n_out: int, k: int, normed: bool = False) -> SkinnyConfig:
    """The launch shape for `rows` rows, N_OUT features over K inputs (`normed`: the norm form).

    One row, plain or gated: 4 features x 1,024 K per program, the fastest of 34 shapes at every
    projection of a Llama-3-8B step on an H100 (benchmarks/skinny_linear_sweep.py, docs/
    benchmarks.md), 4 % under cuBLAS over the layers. The norm form keeps 8 x 512: each of its
    programs reads the rows whole for their statistics, so twice the programs would read twice
    the L2 traffic."""
    if rows == 1 and not normed:
        return SkinnyConfig(block_n=4, block_k=1024, num_warps=4, wide_acc=True)
    return SkinnyConfig(block_n=8, block_k=512, num_warps=4, wide_acc=rows <= 2)
