"""Straightforward reference implementations the sampling tests compare against: one row
at a time, in float64 numpy, written from the definitions (HF warpers, OpenAI penalties)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.sampling_params import SamplingParams


def reference_penalties(
    logits: np.ndarray, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
) -> np.ndarray:
    """HF RepetitionPenaltyLogitsProcessor over prompt + output, then OpenAI
    frequency/presence over output."""
    out = logits.astype(np.float64).copy()
    r = params.repetition_penalty
    for token in set(prompt) | set(output):
        out[token] = out[token] / r if out[token] > 0 else out[token] * r
    for token in set(output):
        count = list(output).count(token)
        out[token] -= params.frequency_penalty * count + params.presence_penalty
    return out


def reference_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampling law of one row: temperature, top-k, top-p on the renormalised top-k
    distribution, min-p relative to the best token; greedy rows are one-hot."""
    x = logits.astype(np.float64)
    vocab = x.shape[0]
    if params.greedy or params.top_k == 1:
        p = np.zeros(vocab)
        p[int(np.argmax(x))] = 1.0
        return p
    x = x / params.temperature
    order = np.argsort(-x, kind="stable")
    keep = np.ones(vocab, dtype=bool)
    if 0 < params.top_k < vocab:
        keep[order[params.top_k :]] = False
    if params.top_p < 1.0:
        kept = order[keep[order]]
        p = np.exp(x[kept] - x[kept].max())
        p /= p.sum()
        above = 0.0
        for token, mass in zip(kept, p, strict=True):
            if above >= params.top_p:
                keep[token] = False
            above += mass
    if params.min_p > 0.0:
        p = np.exp(x - x.max())
        p /= p.sum()
        keep &= p >= params.min_p * p.max()
    p = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    return p / p.sum()


def reference_logit_bias(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """OpenAI logit_bias: each listed token's logit plus its bias, in float64."""
    out = logits.astype(np.float64).copy()
    for token, bias in (params.logit_bias or {}).items():
        out[token] += bias
    return out
