"""Alternatives to how the runner builds a step, chosen by whoever builds the engine. The
engine itself always runs the defaults; benchmarks and tests pass others to measure what the
defaults avoid or to force a workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# (drafts [B, gamma], sampling keys [B], the window's first sampling counter [B])
#   -> (out_tokens [B, W] int64 padded with -1, accept_len [B] int32 in [1, W])
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class RunnerOptions:
    # False: the prefill expansion lets PyTorch read its size back from the device, the host
    # sync docs/design.md §4 rules out (what tests/engine/test_sync_free_loop.py must catch).
    host_sized_expansion: bool = True
    # False: prefill and mixed forwards launch every kernel eagerly instead of replaying the
    # piecewise graphs of engine/runner/piecewise_graphs.py (GPU; what the graphs save).
    piecewise_extend_graphs: bool = True
    # False: requests that share a prefix's slots each read it in their own attention,
    # instead of one shared pass for all of them (Triton backend; docs/design.md §4.9).
    cascade_attention: bool = True
    # Replaces DSpark's acceptance after the verify forward (a benchmark forcing accept
    # lengths); None: the lossless rule of engine/speculative/accept.py.
    accept_rule: AcceptRule | None = None
    # Rows of logits per slice when scoring prompts (engine/runner/prompt_scoring.py); None:
    # as many as fit its byte bound. A test passes a few to cut short prompts into slices.
    prompt_logprob_slice_rows: int | None = None
