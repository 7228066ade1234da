"""Prompt logprobs of a prefill step (docs/design.md §2.4): the logprob of each prompt token
under the model at the position before it, and the top N there, for the chunks that ask.

Which hidden rows score which tokens is known on the host (`PrefillChunk.prompt_targets`),
so the rows and target ids are host arrays copied in like any step input. The logits go
through the vocabulary in slices of at most `max_rows` rows, so a step holds one slice's
[rows, V] float32 at a time; only [P] logprobs and [P, N] alternatives leave the device.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.models.context import CausalLM
from engine.runner.h2d import to_device
from engine.runner.step_output import PromptLogprobs
from engine.sampling.logprobs import compute_logprobs
from engine.scheduler import PrefillChunk

# Float32 logits one slice may hold: 256 MiB (1,365 rows of a 49k vocabulary, 512 of 128k).
SLICE_LOGITS_BYTES = 256 << 20


def slice_rows(vocab_size: int) -> int:
    """Rows of [rows, V] float32 logits that fit in SLICE_LOGITS_BYTES (at least one)."""
    return max(1, SLICE_LOGITS_BYTES // (4 * vocab_size))


def score_prompts(
    model: CausalLM,
    hidden: torch.Tensor,
    chunks: list[PrefillChunk],
    vocab_size: int,
    device: torch.device,
    max_rows: int | None = None,
) -> PromptLogprobs | None:
    """`hidden` [T, H]: the step's final hidden states, chunk after chunk. None when no chunk
    scores its prompt. Logprobs come from the raw logits, as the sampled tokens' do.
    `max_rows`: rows per slice (None: `slice_rows(vocab_size)`)."""
    rows: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    num_top = 0
    chunk_start = 0  # the chunk's first row in `hidden`
    for chunk in chunks:
        span = chunk.prompt_targets
        if len(span):
            # target t is scored by the row of position t - 1
            rows.append(chunk_start + np.arange(span.start - 1, span.stop - 1) - chunk.start)
            targets.append(np.asarray(chunk.req.prompt_ids[span.start : span.stop], dtype=np.int64))
            num_top = max(num_top, chunk.req.params.prompt_logprobs or 0)
        chunk_start += chunk.end - chunk.start
    if not rows:
        return None
    row_ids = np.concatenate(rows)
    num_rows = len(row_ids)
    scored = hidden.index_select(0, to_device(row_ids.astype(np.int64), device))  # [P, H]
    target_ids = to_device(np.concatenate(targets), device)  # [P]
    step = max_rows or slice_rows(vocab_size)
    parts = []
    for start in range(0, num_rows, step):
        end = min(start + step, num_rows)
        logits = model.compute_logits(scored[start:end])  # [rows, V]
        parts.append(compute_logprobs(logits, target_ids[start:end], num_top))
    return PromptLogprobs(
        logprob=torch.cat([p.chosen for p in parts]),
        top_ids=torch.cat([p.top_ids for p in parts]),
        top_logprobs=torch.cat([p.top_logprobs for p in parts]),
    )
