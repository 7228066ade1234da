"""The drafter's training loop: teacher pass, block objective, AdamW with warmup + cosine.

Each step: a padded batch of sequences -> the target (no grad; bf16 on GPU) gives the
captured hidden and its own next-token distributions -> the drafter's dense block forward
for `anchors_per_seq` anchors per row -> training.objective -> AdamW step with
gradient clipping. Drafter weights stay fp32 (master copy); on GPU its forward runs under
bf16 autocast.

The run is resumable and bounded in time:
- `train_state.pt` in the work directory (drafter, optimizer, sampler position, step, the
  total step count) is written every `checkpoint_every` steps, at the deadline, on SIGTERM
  and at the end, atomically; `resume=True` continues from it and replays the same batches;
- `steps = 0` sizes the run to the deadline: after a few timed steps, the total is set to
  what fits, so the cosine schedule ends when the time does;
- an explicit `steps` still stops at the deadline (the schedule is then cut short).

On resume the total comes from the config, not from the saved state, so that several
time-bounded calls make one schedule:
- an explicit `steps` is the total of the whole run (larger or smaller than the total saved,
  never below the steps already done): `steps=N` in every call trains N steps in all;
- `steps = 0` sizes the total again to this call's deadline (step + what fits), keeping the
  saved total for the learning rate of the few timed steps before that. A first call with an
  estimate of the whole run's steps and later calls with `steps = 0` end the cosine when the
  last call's time does. Extending a finished schedule this way raises the learning rate again
  (a warm restart); without a deadline the saved total stands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from tqdm.auto import tqdm

from engine.speculative.drafter import DSparkDrafter
from training.batches import BatchSampler
from training.data import SequenceSet
from training.objective import ObjectiveConfig, block_objective, sample_anchors
from training.teacher import run_teacher

log = logging.getLogger(__name__)

STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.jsonl"
CALIBRATION_STEPS = 6  # timed steps (after 2 untimed) before an auto-sized run sets its length
# An auto-sized run measures again over this many steps after the first sizing and resizes:
# the first steps of a GPU run are slow (allocator growth, kernel autotuning), and sizing on
# them alone planned a quarter of the steps that fitted.
RESIZE_AFTER_STEPS = 100
SAFETY = 0.95  # share of the remaining time an auto-sized run plans to use


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 0  # 0: as many as fit before the deadline
    batch_size: int = 32  # sequences per step
    anchors_per_seq: int = 32  # blocks per sequence per step
    max_seq_len: int = 1024
    lr: float = 6e-4
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    checkpoint_every: int = 250
    log_every: int = 10
    seed: int = 0
    max_auto_steps: int = 200_000
    objective: ObjectiveConfig = ObjectiveConfig()

    def __post_init__(self) -> None:
        for name in ("batch_size", "anchors_per_seq", "max_seq_len", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 0 or self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError("TrainConfig: steps and warmup_steps must be >= 0 and lr > 0")


@dataclass(frozen=True)
class TrainReport:
    steps_done: int
    total_steps: int
    stopped: str  # "done", "deadline" or "signal"
    seconds: float
    final_loss: float | None
    first_loss: float | None
    teacher_forced_accuracy: tuple[float, ...]  # per block row, over the last log window
    sequences_seen: int


def lr_at(step: int, total: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine from lr to lr * min_lr_ratio at step `total`."""
    warmup = min(config.warmup_steps, max(1, total // 10)) if total else config.warmup_steps
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def trainable_parameters(drafter: DSparkDrafter) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices, none on norms, biases and the Markov tables."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in drafter.named_parameters():
        param.requires_grad_(True)  # RMSNorm weights are created frozen (inference modules)
        (decay if param.dim() >= 2 and not name.startswith("markov.") else no_decay).append(param)
    return [{"params": decay, "weight_decay": None}, {"params": no_decay, "weight_decay": 0.0}]


@contextlib.contextmanager
def _sigterm_flag(flag: dict[str, bool]) -> Iterator[None]:
    """While active, SIGTERM sets flag["stop"] instead of killing the process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: object) -> None:
        flag["stop"] = True

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Trainer:
    def __init__(
        self,
        drafter: DSparkDrafter,
        target: nn.Module,
        train_set: SequenceSet,
        config: TrainConfig,
        work_dir: str | Path,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        on_checkpoint: Callable[[DSparkDrafter, int], None] | None = None,
    ) -> None:
        self.drafter = drafter
        self.target = target.requires_grad_(False).eval()
        self.lm_head: Callable[[torch.Tensor], torch.Tensor] = cast(Any, target).compute_logits
        self.config = config
        self.work_dir = Path(work_dir)
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.on_checkpoint = on_checkpoint
        self.sampler = BatchSampler(train_set, config.batch_size, config.max_seq_len, config.seed)
        groups = trainable_parameters(drafter)
        groups[0]["weight_decay"] = config.weight_decay
        self.optimizer = torch.optim.AdamW(
            groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda"
        )
        self.step = 0
        self.total_steps = config.steps
        self.sequences_seen = 0
        self.flag = {"stop": False}

    # ---- state --------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    def save_state(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "step": self.step,
            "total_steps": self.total_steps,
            "sequences_seen": self.sequences_seen,
            "drafter_config": self.drafter.config.to_dict(),
            "train_config": dataclasses.asdict(self.config),
            "drafter": self.drafter.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
        }
        tmp = self.state_path.with_name(STATE_FILE + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.state_path)
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.drafter, self.step)

    def load_state(self) -> bool:
        """Continue from the work directory's state if there is one; True if it was loaded."""
        if not self.state_path.is_file():
            return False
        state = torch.load(self.state_path, map_location=self.device, weights_only=False)
        if state["drafter_config"] != self.drafter.config.to_dict():
            raise ValueError(
                f"{self.state_path} was written for another drafter config; "
                "use a fresh work directory or the same drafter options"
            )
        step, saved_total = int(state["step"]), int(state["total_steps"])
        if self.config.steps and self.config.steps < step:
            raise ValueError(
                f"{self.state_path} has {step} steps done, more than the {self.config.steps} steps asked for: "
                "ask for at least as many steps, or 0 to size the run to the time budget"
            )
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = step
        # An explicit step count is the whole run's total; 0 keeps the saved one until run() sizes it again.
        self.total_steps = self.config.steps or saved_total
        self.sequences_seen = int(state["sequences_seen"])
        log.info(
            "resumed drafter training at step %d of %d%s",
            self.step,
            self.total_steps,
            f" (was {saved_total})" if self.total_steps != saved_total else "",
        )
        return True

    # ---- the loop -----------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def train_step(self) -> dict[str, Any]:
        cfg = self.config
        batch = self.sampler.next_batch(self.device)
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed * 1_000_003 + self.step)
        anchors, valid = sample_anchors(batch, cfg.anchors_per_seq, generator)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, self.total_steps, cfg)
        with self._autocast():
            teacher = run_teacher(self.target, self.drafter.config.capture_layers, batch.tokens, batch.lengths)
            out = block_objective(
                self.drafter,
                self.lm_head,
                teacher,
                batch,
                anchors,
                valid,
                cfg.objective,
            )
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.step += 1
        self.sequences_seen += int(batch.tokens.shape[0])
        return {
            "loss": out.label_loss,
            "conf_loss": out.confidence_loss,
            "kl": out.kl,
            "grad_norm": grad_norm,
            "correct": out.correct,
            "counted": out.counted,
        }

    def run(self, deadline: float | None = None, progress: bool = True) -> TrainReport:
        """Train until total_steps, the deadline (time.monotonic seconds) or SIGTERM."""
        cfg = self.config
        if self.total_steps == 0 and deadline is None:
            raise ValueError("steps=0 sizes the run to a time budget: give a deadline (max minutes) or steps")
        # Sized to the deadline: a fresh run with steps=0, and a resumed one (whose saved total
        # only sets the learning rate until then; see the module doc).
        sized = cfg.steps != 0 or deadline is None
        self.drafter.train()
        start = time.monotonic()
        stopped = "done"
        first_loss: float | None = None
        last: dict[str, Any] = {}
        window: list[dict[str, Any]] = []
        timer_start: float | None = None
        calibrated_at = self.step + 2 + CALIBRATION_STEPS
        resize_at = -1  # an auto-sized run's step at which it measures again
        saved_at = -1
        self.work_dir.mkdir(parents=True, exist_ok=True)
        bar = tqdm(
            total=self.total_steps or None,
            initial=self.step,
            desc="training",
            unit="step",
            disable=not progress,
        )
        with _sigterm_flag(self.flag), (self.work_dir / LOG_FILE).open("a") as log_file:
            while not sized or self.step < self.total_steps:
                if self.flag["stop"]:
                    stopped = "signal"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    stopped = "deadline"
                    break
                if not sized and self.step == calibrated_at - CALIBRATION_STEPS:
                    self._sync()
                    timer_start = time.monotonic()
                window.append(self.train_step())
                sizing = not sized and self.step == calibrated_at
                if (sizing or self.step == resize_at) and timer_start is not None:
                    self._sync()
                    now = time.monotonic()
                    step_s = (now - timer_start) / (CALIBRATION_STEPS if sizing else self.step - calibrated_at)
                    fits = int(SAFETY * (deadline - now) / step_s) if deadline else 0
                    self.total_steps = max(self.step + 1, min(cfg.max_auto_steps, self.step + fits))
                    sized = True
                    if sizing:  # measure again halfway, or after RESIZE_AFTER_STEPS
                        resize_at = self.step + max(1, min(RESIZE_AFTER_STEPS, (self.total_steps - self.step) // 2))
                        timer_start = now
                    bar.total = self.total_steps
                    log.info("%.3f s/step: training for %d steps", step_s, self.total_steps)
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    last = self._log(window, log_file, time.monotonic() - start)
                    first_loss = last["loss"] if first_loss is None else first_loss
                    bar.set_postfix(loss=f"{last['loss']:.3f}", acc0=f"{last['acc'][0]:.2f}", lr=f"{last['lr']:.1e}")
                    window = []
                if self.step % cfg.checkpoint_every == 0:
                    self.save_state()
                    saved_at = self.step
            if window:
                last = self._log(window, log_file, time.monotonic() - start)
                first_loss = last["loss"] if first_loss is None else first_loss
            if saved_at != self.step:  # still under the SIGTERM guard: a second signal cannot cut the write
                self.save_state()
        bar.close()
        self.drafter.eval()
        return TrainReport(
            steps_done=self.step,
            total_steps=self.total_steps,
            stopped=stopped,
            seconds=time.monotonic() - start,
            final_loss=last.get("loss"),
            first_loss=first_loss,
            teacher_forced_accuracy=tuple(last.get("acc", ())),
            sequences_seen=self.sequences_seen,
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _log(self, window: list[dict[str, Any]], log_file: Any, elapsed: float) -> dict[str, Any]:
        """Average a window of step metrics (one host sync per window) and append it to the log."""
        correct = torch.stack([w["correct"] for w in window]).sum(0)
        counted = torch.stack([w["counted"] for w in window]).sum(0).clamp(min=1)
        kls = [w["kl"] for w in window if w["kl"] is not None]
        record: dict[str, Any] = {
            "step": self.step,
            "elapsed_s": round(elapsed, 2),
            "lr": lr_at(self.step - 1, self.total_steps, self.config),
            "loss": float(torch.stack([w["loss"] for w in window]).mean()),
            "conf_loss": float(torch.stack([w["conf_loss"] for w in window]).mean()),
            "kl": float(torch.stack(kls).mean()) if kls else None,
            "grad_norm": float(torch.stack([w["grad_norm"] for w in window]).mean()),
            "acc": [round(float(a), 4) for a in (correct / counted)],
        }
        if log_file is not None:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        return record
