"""The forward of a step that carries prefill chunks: a prefill step, or a mixed step whose
decode rows ride in the same forward (docs/design.md §2.3).

Layout of the one ragged forward, T tokens (a host int):

    [ decode rows: B windows of w tokens | chunk 0 | chunk 1 | ... ]

w is 1 (plain decoding, or DSpark over its batch cap) or W = gamma + 1 (a DSpark verify
window, drafted first by the drafter's own forward). Decode rows read their positions and
input tokens from the per-row device buffers (`kv_len`, `last_token`); chunks bring theirs
from the host. Every shape comes from host ints, so nothing is read back (docs/design.md §4).
After the forward the decode rows commit exactly as a decode step of their own would
(the same sampling calls, counters and draft-KV injection), and the chunks that end a fill
sample their first token. Output rows: decode rows first, then one per chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.kernels.attention_metadata import SharedPrefix
from engine.models.context import ForwardContext
from engine.request import Request
from engine.runner.batch_inputs import ExtendInputs, concat_extend, expand_extend, uniform_window
from engine.runner.grammar_rows import GrammarRows
from engine.runner.h2d import to_device
from engine.runner.prompt_scoring import score_prompts
from engine.runner.step_output import DeviceStepOutput, StepLogprobs, concat_rows
from engine.scheduler import ScheduledStep

if TYPE_CHECKING:
    from engine.runner.model_runner import ModelRunner
    from engine.runner.spec_decode import Draft


def launch_extend(runner: ModelRunner, step: ScheduledStep) -> DeviceStepOutput:
    chunks = step.chunks
    rows = np.array([c.req.row for c in chunks], dtype=np.int64)
    starts = np.array([c.start for c in chunks], dtype=np.int32)
    ends = np.array([c.end for c in chunks], dtype=np.int32)
    ids = to_device(
        np.concatenate([np.asarray(c.req.fill_ids[c.start : c.end], dtype=np.int64) for c in chunks]), runner.device
    )
    decode = step.decode
    # Keys the forward's requests, decode rows first, read through the same slots (§4.9);
    # each sees at least its last processed length (decode rows) or its chunk's start.
    decode_rows = np.array([r.row for r in decode], dtype=np.int64)
    shared_host = runner.shared_rows(
        np.concatenate((decode_rows, rows)), np.concatenate((np.array([r.kv_len for r in decode]), starts))
    )
    shared = None if shared_host is None else shared_host.to_device(runner.device, shared_host.length)
    chunk_inputs = expand_extend(
        runner.req_to_token,
        rows,
        starts,
        ends - starts,
        runner.device,
        host_sized_expansion=runner.options.host_sized_expansion,
        shared=shared if not decode else None,
    )
    draft: Draft | None = None
    inputs = chunk_inputs
    if decode:
        decode_shared = None if shared is None else shared.rows(0, len(decode))
        decode_inputs, decode_ids, draft = _decode_rows(runner, step, decode_rows, decode_shared)
        inputs = concat_extend(decode_inputs, chunk_inputs, shared)
        ids = torch.cat((decode_ids, ids))
    num_decode_tokens = inputs.meta.num_tokens - chunk_inputs.meta.num_tokens
    ctx = ForwardContext(inputs.meta, runner.kv_pool, runner.backend, capture_layers=runner.capture_layers)
    piecewise = runner.piecewise
    if piecewise is not None and piecewise.bucket_for(inputs.meta.num_tokens) is not None:
        hidden = piecewise(ids, inputs.positions, ctx)  # [T, H], the graphs' static output
    else:
        hidden = runner.model(ids, inputs.positions, ctx)  # [T, H]
    aux = ctx.aux_hidden()  # [T, K*H] with DSpark, else None
    if runner.dspark is not None:
        assert aux is not None  # capture_layers are the drafter's
        # chunk tokens all get draft KV; decode rows inject what they commit, below
        runner.dspark.inject(aux[num_decode_tokens:], chunk_inputs.positions, chunk_inputs.meta.out_slots)
    chunk_out = _sample_chunks(runner, hidden[num_decode_tokens:], step, rows, ends)
    if not decode:
        return chunk_out
    decode_hidden = hidden[:num_decode_tokens]
    decode_aux = None if aux is None else aux[:num_decode_tokens]
    if draft is not None:
        assert runner.dspark is not None and decode_aux is not None
        decode_out = runner.dspark.commit(draft, decode_hidden, decode_aux, decode, runner.last_token, runner.kv_len)
    else:
        meta, num = inputs.meta, len(decode)  # one token per decode row: rows [0, num)
        decode_out = commit_one_token(
            runner, decode_hidden, decode_aux, meta.req_rows[:num], inputs.positions[:num], meta.out_slots[:num], decode
        )
    return concat_rows(decode_out, chunk_out)


def _decode_rows(
    runner: ModelRunner, step: ScheduledStep, rows: np.ndarray, shared: SharedPrefix | None
) -> tuple[ExtendInputs, torch.Tensor, Draft | None]:
    """The decode rows' part of the forward (table `rows`, sharing `shared`'s keys): its
    inputs, its input tokens, and the draft it verifies (None: one token per row)."""
    rows_d = to_device(rows, runner.device)
    kv_before = np.array(step.kv_before, dtype=np.int32)  # upper bounds (exact without DSpark)
    max_len = int(kv_before.max())
    if runner.dspark is not None and runner.drafts_for(step.decode):
        draft = runner.dspark.propose(
            rows_d, max_len, step.decode, runner.req_to_token, runner.last_token, runner.kv_len, shared
        )
        return draft.verify, draft.verify_ids, draft
    # DSpark's host knows only a bound on each row's length: the device has it.
    starts_d = to_device(kv_before, runner.device) if runner.dspark is None else runner.kv_len[rows_d]
    inputs = uniform_window(runner.req_to_token, rows_d, starts_d, 1, max_len + 1, causal=True, shared=shared)
    return inputs, runner.last_token[rows_d], None


def commit_one_token(
    runner: ModelRunner,
    hidden: torch.Tensor,
    aux: torch.Tensor | None,
    rows_d: torch.Tensor,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
    reqs: list[Request],
    grammar: GrammarRows | None = None,
) -> DeviceStepOutput:
    """Sample and commit one token per decode row (rows_d [B]) from its final hidden state
    `hidden` [B, H] at `positions` [B] int64: the row's buffers advance, and with DSpark (a
    batch over the cap) the token's captured `aux` [B, K*H] becomes draft KV at `out_slots`.
    `reqs` empty: greedy without penalties or logprobs (the captured variant). `grammar`:
    the rows' masks (a captured step's static buffers), else filled from `reqs`."""
    if runner.dspark is not None:
        assert aux is not None  # capture_layers are the drafter's
        runner.dspark.inject(aux, positions, out_slots)
    logits = runner.model.compute_logits(hidden)  # [B, V]
    sample = runner.sampling.sample(logits, rows_d, positions + 1, reqs, grammar)
    runner.last_token[rows_d] = sample.tokens
    new_len = (positions + 1).to(torch.int32)
    runner.kv_len[rows_d] = new_len
    runner.sampling.record_outputs(rows_d, sample.tokens[:, None])
    return DeviceStepOutput(
        tokens=sample.tokens[:, None],
        accept_len=torch.ones_like(new_len),
        kv_len=new_len,
        logprobs=sample.step_logprobs(rows_d.shape[0], None),
    )


def _sample_chunks(
    runner: ModelRunner, hidden: torch.Tensor, step: ScheduledStep, rows: np.ndarray, ends: np.ndarray
) -> DeviceStepOutput:
    """One output row per chunk from the chunks' hidden states [Tc, H]: chunks that end a
    fill sample their first token at their last row; the others give a padded row
    (accept_len 0)."""
    chunks = step.chunks
    device = runner.device
    sampling = np.array([c.samples for c in chunks])
    last_rows = np.cumsum([c.end - c.start for c in chunks]) - 1
    num = len(chunks)
    tokens = torch.full((num, 1), -1, dtype=torch.int64, device=device)
    accept_len = to_device(sampling.astype(np.int32), device)
    kv_len = to_device(ends, device)
    logprobs: StepLogprobs | None = None
    if sampling.any():
        pick = np.flatnonzero(sampling)
        pick_d = to_device(pick, device)
        rows_s = to_device(rows[pick], device)
        logits = runner.model.compute_logits(hidden[to_device(last_rows[pick], device)])  # [S, V]
        counters = to_device(ends[pick].astype(np.int64), device)
        reqs = [chunks[i].req for i in pick]
        sample = runner.sampling.sample(logits, rows_s, counters, reqs)
        tokens[pick_d, 0] = sample.tokens
        runner.last_token[rows_s] = sample.tokens
        runner.kv_len[rows_s] = to_device(ends[pick], device)
        runner.sampling.record_outputs(rows_s, sample.tokens[:, None])
        logprobs = sample.step_logprobs(num, pick_d)
    prompt_logprobs = score_prompts(
        runner.model, hidden, chunks, runner.vocab_size, device, runner.options.prompt_logprob_slice_rows
    )
    return DeviceStepOutput(tokens, accept_len, kv_len, logprobs, prompt_logprobs=prompt_logprobs)
