"""The drafter's training objective for one batch.

For each row, `anchors_per_seq` anchor positions p are drawn from the answer (p >= the
prompt length: at inference the first anchor is the first generated token), and the block
at p is trained to predict the target's next gamma tokens:

- block row i predicts the token at p+1+i; its Markov correction is teacher-forced with the
  true previous token x_{p+i} (the anchor for i = 0), which is what inference feeds it
  whenever drafts 0..i-1 were accepted;
- labels (`LabelMode`): `soft` (default) is cross-entropy against the target's full
  distribution at p+i (its logits after x_{<=p+i}, temperature 1). On answers sampled at
  T=1 its expectation is the loss on the sampled tokens, without their variance; its argmax
  is the greedy token (what greedy verification accepts), and matching the whole law is
  what sampled verification rewards (a draft is accepted with probability 1 - TV(p_T, q_T),
  and q = p at T = 1 gives q_T = p_T at every T).
  `argmax` trains on the greedy token only; `token` on the data's next token (the target's
  own sample; the argmax on corpus text). On the tiny test targets the three end within
  noise of each other; on a real target it is a flag (`--labels`) to measure;
- rows are weighted `position_decay ** i`: acceptance is a prefix, so an early miss costs
  every later draft. With conditional acceptance a_j, the expected committed length is
  1 + sum_k prod_{j<=k} a_j, and its derivative in log a_i is the tail sum_{k>=i} prod a_j:
  at the rates drafters reach on SmolLM2 (a_j ~ 0.6-0.7) that tail falls about 0.6x per row,
  hence the default 0.6 (the shipped drafter's last round; earlier rounds used 0.8, which
  spends ~5-10x too much of the loss on the last rows);
- the confidence head learns by binary cross-entropy whether the Markov argmax at row i
  equals the target's greedy token, the event "draft i is accepted given drafts < i were"
  under greedy verification. Its inputs are detached: it is a probe and does not shape the
  drafter's features.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from engine.speculative.drafter import DSparkDrafter
from training.batches import Batch
from training.block import base_logits, block_offsets, draft_block_hidden, teacher_forced_steps
from training.teacher import TeacherOutput

LabelMode = Literal["soft", "argmax", "token"]
LABEL_MODES: tuple[str, ...] = ("soft", "argmax", "token")


@dataclass(frozen=True)
class ObjectiveConfig:
    labels: LabelMode = "soft"
    position_decay: float = 0.6
    confidence_weight: float = 0.1

    def __post_init__(self) -> None:
        if self.labels not in LABEL_MODES:
            raise ValueError(f"labels must be one of {', '.join(LABEL_MODES)}, got {self.labels!r}")
        if not 0.0 < self.position_decay <= 1.0:
            raise ValueError(f"position_decay must be in (0, 1], got {self.position_decay}")


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor  # scalar, differentiable
    label_loss: torch.Tensor  # scalar (detached): weighted cross-entropy of the drafts
    confidence_loss: torch.Tensor  # scalar (detached)
    kl: torch.Tensor | None  # scalar (detached): mean KL(target || draft) per labelled row (soft labels)
    correct: torch.Tensor  # [gamma] float: teacher-forced argmax == target argmax, per block row
    counted: torch.Tensor  # [gamma] float: labelled rows per block row


def sample_anchors(batch: Batch, num_anchors: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors [B, A] int64, valid [B, A] bool): up to A distinct positions per row in
    [max(prompt_len, 1), length - 2], uniformly; rows with fewer fill the rest with invalid 0s."""
    tokens = batch.tokens
    rows, seq_len = tokens.shape
    num_anchors = min(num_anchors, seq_len)
    pos = torch.arange(seq_len, device=tokens.device)
    lo = batch.prompt_lens.clamp(min=1)[:, None]
    ok = (pos >= lo) & (pos <= batch.lengths[:, None] - 2)  # [B, S]
    scores = torch.rand(rows, seq_len, generator=generator, device=generator.device).to(tokens.device)
    scores = torch.where(ok, scores, torch.full_like(scores, -1.0))
    top, anchors = scores.topk(num_anchors, dim=1)
    valid = top >= 0
    return torch.where(valid, anchors, torch.zeros_like(anchors)), valid


def block_objective(
    drafter: DSparkDrafter,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    teacher: TeacherOutput,
    batch: Batch,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    config: ObjectiveConfig,
) -> ObjectiveOutput:
    gamma = drafter.config.gamma
    tokens = batch.tokens
    rows, seq_len = tokens.shape
    hidden = draft_block_hidden(drafter, teacher.aux, tokens, anchors)  # [B, A, g, H]
    base = base_logits(lm_head, hidden)  # [B, A, g, V]
    offsets = block_offsets(anchors, gamma)  # [B, A, g]: p + i
    flat = offsets.clamp(max=seq_len - 1).flatten(1)
    prev = tokens.gather(1, flat).view_as(offsets)  # x_{p+i}
    step, prev_embed = teacher_forced_steps(drafter, base, prev)  # [B, A, g, V] float32
    labelled = valid[..., None] & (offsets <= (batch.lengths - 2)[:, None, None])  # x_{p+i+1} exists

    with torch.no_grad():
        target_logits = teacher.logits_at(offsets)  # [B, A, g, V] float32
        target_argmax = target_logits.argmax(dim=-1)
    log_q = F.log_softmax(step, dim=-1)
    kl = None
    if config.labels == "soft":
        target_p = F.softmax(target_logits, dim=-1)
        cross_entropy = -(target_p * log_q).sum(dim=-1)
        with torch.no_grad():
            entropy = -(target_p * F.log_softmax(target_logits, dim=-1)).sum(dim=-1)
            kl_rows = cross_entropy.detach() - entropy
        del target_p
    else:
        label = target_argmax
        if config.labels == "token":
            data_next = tokens.gather(1, (offsets + 1).clamp(max=seq_len - 1).flatten(1)).view_as(offsets)
            label = torch.where(batch.from_target[:, None, None], data_next, target_argmax)
        cross_entropy = -log_q.gather(-1, label[..., None]).squeeze(-1)
    del target_logits

    decay = config.position_decay ** torch.arange(gamma, device=tokens.device, dtype=torch.float32)
    weights = labelled.float() * decay  # [B, A, g]
    total_weight = weights.sum().clamp(min=1e-6)
    label_loss = (cross_entropy * weights).sum() / total_weight
    if config.labels == "soft":
        kl = (kl_rows * labelled).sum() / labelled.sum().clamp(min=1)

    correct = (step.detach().argmax(dim=-1) == target_argmax) & labelled  # [B, A, g]
    confidence_loss = torch.zeros((), device=tokens.device)
    if drafter.confidence is not None:
        conf_logit = drafter.confidence.logit(hidden.detach(), prev_embed.detach())  # [B, A, g]
        bce = F.binary_cross_entropy_with_logits(conf_logit, correct.float(), reduction="none")
        confidence_loss = (bce * labelled).sum() / labelled.sum().clamp(min=1)
    loss = label_loss + config.confidence_weight * confidence_loss
    return ObjectiveOutput(
        loss=loss,
        label_loss=label_loss.detach(),
        confidence_loss=confidence_loss.detach(),
        kl=None if kl is None else kl.detach(),
        correct=correct.float().sum(dim=(0, 1)),
        counted=labelled.float().sum(dim=(0, 1)),
    )
