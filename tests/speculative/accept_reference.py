"""A plain NumPy statement of chain rejection sampling, one request at a time, for checking
engine.speculative.accept against given uniforms."""

from __future__ import annotations

import numpy as np


def chain_rejection_numpy(
    draft_tokens: np.ndarray, q: np.ndarray, p: np.ndarray, coin_u: np.ndarray, resample_u: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """draft_tokens [B, g], q [B, g, V], p [B, g+1, V], coin_u [B, g], resample_u [B] ->
    (out_tokens [B, g+1] padded with -1, accept_len [B])."""
    batch, gamma = draft_tokens.shape
    out = np.full((batch, gamma + 1), -1, dtype=np.int64)
    accept_len = np.zeros(batch, dtype=np.int64)
    for b in range(batch):
        n = 0
        while n < gamma:
            d = draft_tokens[b, n]
            ratio = 1.0 if q[b, n, d] == 0 and p[b, n, d] > 0 else (p[b, n, d] / q[b, n, d] if q[b, n, d] > 0 else 0.0)
            if not coin_u[b, n] < min(1.0, ratio):
                break
            out[b, n] = d
            n += 1
        if n < gamma:
            residual = np.maximum(p[b, n].astype(np.float64) - q[b, n], 0.0)
            if residual.sum() <= 0:
                residual = p[b, n].astype(np.float64)
        else:
            residual = p[b, gamma].astype(np.float64)
        # Inverse CDF: the first token whose cumulative weight passes u * total.
        cdf = np.cumsum(residual)
        out[b, n] = int(np.searchsorted(cdf, float(resample_u[b]) * cdf[-1], side="right"))
        accept_len[b] = n + 1
    return out, accept_len
