"""Held-out acceptance of a drafter, simulated as inference runs it.

Greedy (temperature 0), on held-out sequences the target answered greedily: walk each answer
as the engine would. At anchor position p (the first is the first answer token) the drafter
drafts a block with the context KV of [0, p) and the anchor token, choosing each token by the
Markov argmax chain (engine.speculative.markov.markov_block, as `propose` does); the target's greedy
tokens after p are its argmax at p, p+1, ..., which on a greedy sequence are the sequence's own
next tokens. Draft i is accepted while it equals them; the verify commits the accepted drafts
plus the bonus, and the next anchor is the bonus at p + accepted + 1. Where the target's
argmax (recomputed here) and the stored greedy token disagree (rounding in generation), the
greedy path beyond that point is unknown and acceptance stops there.
Reported: committed tokens per verify (accepted + 1, docs/design.md's `dspark_spec_accept_length`)
and P(draft i accepted) per position.

Sampled (temperature T, default 0.7), on held-out sequences sampled at the temperature
nearest T: for every answer anchor p, chain rejection sampling accepts draft i with
probability sum_v min(p_i(v), q_i(v)) given drafts < i accepted (Leviathan et al. 2023), with
p_i = softmax(target logits / T) and q_i = softmax(Markov step logits / T). The expected
committed tokens per verify are 1 + sum_i prod_{j<=i} alpha_j. The previous token that
conditions row i is the sequence's own token (a sample of the target's law): an
approximation of the accepted draft, whose law is norm(min(p, q)).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from engine.speculative.drafter import DSparkDrafter
from training.batches import pad_batch, trainable
from training.block import (
    base_logits,
    block_offsets,
    draft_block_hidden,
    free_running_steps,
    teacher_forced_steps,
)
from training.data import SequenceSet
from training.teacher import TeacherOutput, run_teacher

BLOCK_ROWS_PER_CALL = 4096  # block rows (anchors x gamma x batch) per drafter forward


@dataclass(frozen=True)
class AcceptanceReport:
    gamma: int
    greedy_sequences: int
    greedy_verifies: int
    greedy_accept_len: float  # committed tokens per verify: accepted drafts + 1
    greedy_per_position: tuple[float, ...]  # P(draft i accepted), per verify
    sampled_temperature: float
    sampled_data_temperature: float | None  # temperature the evaluated sequences were sampled at
    sampled_sequences: int
    sampled_anchors: int
    sampled_accept_len: float  # expected committed tokens per verify
    sampled_per_position: tuple[float, ...]  # expected P(draft i accepted)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        head = "".join(f"{i:>7d}" for i in range(self.gamma))
        rows = [
            f"held-out acceptance (gamma={self.gamma}); columns: P(draft i accepted)",
            f"{'':<28}{'tokens/verify':>14}{head}",
        ]

        def row(name: str, accept_len: float, per_position: tuple[float, ...]) -> str:
            return f"{name:<28}{accept_len:>14.3f}" + "".join(f"{v:>7.3f}" for v in per_position)

        rows.append(row(f"greedy ({self.greedy_verifies} verifies)", self.greedy_accept_len, self.greedy_per_position))
        rows.append(
            row(
                f"T={self.sampled_temperature:g} ({self.sampled_anchors} anchors)",
                self.sampled_accept_len,
                self.sampled_per_position,
            )
        )
        return "\n".join(rows)


def _pick(
    sequences: SequenceSet, want_greedy: bool, temperature: float, limit: int, max_seq_len: int
) -> tuple[np.ndarray, float | None]:
    usable = set(trainable(sequences, max_seq_len).tolist())
    temps = sequences.temperatures
    if want_greedy:
        chosen = [i for i in np.flatnonzero(temps == 0) if i in usable]
        data_temp: float | None = 0.0
    else:
        sampled = temps[temps > 0]
        if len(sampled):
            data_temp = float(sampled[np.argmin(np.abs(sampled - temperature))])
            chosen = [i for i in np.flatnonzero(temps == data_temp) if i in usable]
        else:  # no sampled answers: the greedy ones still give the target's laws
            data_temp, chosen = 0.0, [i for i in np.flatnonzero(temps == 0) if i in usable]
    return np.asarray(chosen[:limit], dtype=np.int64), (data_temp if chosen else None)


def _walk(drafts: np.ndarray, argmax: np.ndarray, tokens: np.ndarray, prompt_len: int, length: int) -> list[int]:
    """Accepted drafts of every verify of one greedy sequence. drafts [S, gamma] (row p: the
    block drafted at anchor p), argmax [S], tokens [S]."""
    gamma = drafts.shape[1]
    consistent = tokens[1:length] == argmax[: length - 1]  # [length-1]: x_{s+1} is the greedy token after s
    accepted = []
    p = max(prompt_len, 1)
    while p <= length - 2:
        a = 0
        while a < gamma and p + a <= length - 2 and drafts[p, a] == argmax[p + a] and (a == 0 or consistent[p + a - 1]):
            a += 1
        accepted.append(a)
        p += a + 1
    return accepted


def _anchor_chunks(seq_len: int, rows: int, gamma: int) -> list[torch.Tensor]:
    per_call = max(1, BLOCK_ROWS_PER_CALL // (rows * gamma))
    return [torch.arange(s, min(seq_len, s + per_call)) for s in range(0, seq_len, per_call)]


@torch.no_grad()
def _greedy(
    drafter: DSparkDrafter, lm_head: Any, teacher: TeacherOutput, prompt_lens: np.ndarray, lengths: np.ndarray
) -> list[int]:
    gamma = drafter.config.gamma
    rows, seq_len = teacher.tokens.shape
    drafts = torch.empty(rows, seq_len, gamma, dtype=torch.int64, device=teacher.tokens.device)
    for positions in _anchor_chunks(seq_len, rows, gamma):
        anchors = positions.to(teacher.tokens.device)[None].expand(rows, -1)
        hidden = draft_block_hidden(drafter, teacher.aux, teacher.tokens, anchors)
        base = base_logits(lm_head, hidden).flatten(0, 1)  # [B*a, g, V]
        block = free_running_steps(drafter, base, teacher.tokens.gather(1, anchors).flatten())
        drafts[:, positions.to(drafts.device)] = block.draft_tokens.view(rows, -1, gamma)
    drafts_np, argmax_np = drafts.cpu().numpy(), teacher.argmax_all().cpu().numpy()
    tokens_np = teacher.tokens.cpu().numpy()
    accepted: list[int] = []
    for b in range(rows):
        accepted += _walk(drafts_np[b], argmax_np[b], tokens_np[b], int(prompt_lens[b]), int(lengths[b]))
    return accepted


@torch.no_grad()
def _sampled(
    drafter: DSparkDrafter,
    lm_head: Any,
    teacher: TeacherOutput,
    prompt_lens: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """[N_anchors, gamma] survival prod_{j<=i} alpha_j of every answer anchor of the batch."""
    gamma = drafter.config.gamma
    rows, seq_len = teacher.tokens.shape
    lengths = teacher.lengths
    out = []
    for positions in _anchor_chunks(seq_len, rows, gamma):
        anchors = positions.to(teacher.tokens.device)[None].expand(rows, -1)
        offsets = block_offsets(anchors, gamma)  # [B, a, g]
        prev = teacher.tokens.gather(1, offsets.clamp(max=seq_len - 1).flatten(1)).view_as(offsets)
        hidden = draft_block_hidden(drafter, teacher.aux, teacher.tokens, anchors)
        step, _ = teacher_forced_steps(drafter, base_logits(lm_head, hidden), prev)
        q = torch.softmax(step / temperature, dim=-1)
        p = torch.softmax(teacher.logits_at(offsets) / temperature, dim=-1)
        alpha = torch.minimum(p, q).sum(dim=-1)  # [B, a, g]
        alpha = alpha * (offsets <= (lengths - 2)[:, None, None])
        survival = alpha.cumprod(dim=-1)
        is_answer = (anchors >= prompt_lens.clamp(min=1)[:, None]) & (anchors <= (lengths - 2)[:, None])
        out.append(survival[is_answer])
    return torch.cat(out)


def evaluate_acceptance(
    drafter: DSparkDrafter,
    target: nn.Module,
    sequences: SequenceSet,
    device: torch.device,
    temperature: float = 0.7,
    max_sequences: int = 256,
    batch_size: int = 8,
    max_seq_len: int = 1024,
    autocast_dtype: torch.dtype | None = None,
) -> AcceptanceReport:
    """Acceptance of `drafter` on `sequences` (the held-out split), as described above."""
    gamma = drafter.config.gamma
    capture = drafter.config.capture_layers
    lm_head = target.compute_logits
    was_training = drafter.training
    drafter.eval()
    autocast = (
        torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    )
    greedy_ids, _ = _pick(sequences, True, temperature, max_sequences, max_seq_len)
    sampled_ids, data_temp = _pick(sequences, False, temperature, max_sequences, max_seq_len)
    accepted: list[int] = []
    survivals: list[torch.Tensor] = []
    with autocast:
        for start in range(0, len(greedy_ids), batch_size):
            batch = pad_batch(sequences, greedy_ids[start : start + batch_size], device, max_seq_len)
            teacher = run_teacher(target, capture, batch.tokens, batch.lengths)
            accepted += _greedy(drafter, lm_head, teacher, batch.prompt_lens.cpu().numpy(), batch.lengths.cpu().numpy())
        for start in range(0, len(sampled_ids), batch_size):
            batch = pad_batch(sequences, sampled_ids[start : start + batch_size], device, max_seq_len)
            teacher = run_teacher(target, capture, batch.tokens, batch.lengths)
            survivals.append(_sampled(drafter, lm_head, teacher, batch.prompt_lens, temperature).float().cpu())
    drafter.train(was_training)
    acc = np.asarray(accepted, dtype=np.int64)
    greedy_curve = tuple(float((acc > i).mean()) if len(acc) else 0.0 for i in range(gamma))
    surv = torch.cat(survivals) if survivals else torch.zeros(0, gamma)
    return AcceptanceReport(
        gamma=gamma,
        greedy_sequences=len(greedy_ids),
        greedy_verifies=len(acc),
        greedy_accept_len=float(acc.mean() + 1) if len(acc) else 0.0,
        greedy_per_position=greedy_curve,
        sampled_temperature=temperature,
        sampled_data_temperature=data_temp,
        sampled_sequences=len(sampled_ids),
        sampled_anchors=int(surv.shape[0]),
        sampled_accept_len=float(1 + surv.sum(dim=1).mean()) if len(surv) else 0.0,
        sampled_per_position=tuple(float(v) for v in surv.mean(dim=0)) if len(surv) else (0.0,) * gamma,
    )
