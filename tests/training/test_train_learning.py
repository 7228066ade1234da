"""Training learns: on a target with a learnable structure the loss falls and held-out
acceptance rises far above chance; a run stopped by SIGTERM resumes to the same weights; a
time budget sizes the run; a resumed run takes its total from its own settings."""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

import pytest
import torch
from train_helpers import EOS, successor_target, tiny_drafter_config, tiny_target_config

from engine.speculative.drafter import DSparkDrafter
from training.data import SequenceSet
from training.evaluate import evaluate_acceptance
from training.generate import DenseGenerator
from training.objective import ObjectiveConfig
from training.trainer import TrainConfig, Trainer, lr_at

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def successor_data() -> tuple[torch.nn.Module, SequenceSet]:
    """The successor target's own greedy and T=0.7 answers to random prompts; 1 in 8 held out."""
    config = tiny_target_config()
    target = successor_target(config)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(8, 64, (int(torch.randint(4, 12, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(160)
    ]
    temps = [0.0 if i % 2 == 0 else 0.7 for i in range(160)]
    answers = DenseGenerator(target, config, [EOS], CPU, max_rows=160).generate(prompts, temps, list(range(160)), 40)
    seqs = SequenceSet.from_lists(
        [p + a for p, a in zip(prompts, answers, strict=True)],
        [len(p) for p in prompts],
        temps,
        [i % 8 < 2 for i in range(160)],
    )
    return target, seqs


def new_drafter(target: torch.nn.Module, seed: int = 0, **overrides: object) -> DSparkDrafter:
    torch.manual_seed(seed)
    drafter = DSparkDrafter(tiny_drafter_config(target.config, **{"gamma": 4, "markov_rank": 16, **overrides}))
    drafter.bind_target(target.embed, target.compute_logits)
    return drafter


def test_loss_falls_and_heldout_acceptance_rises(successor_data, tmp_path) -> None:
    target, seqs = successor_data
    drafter = new_drafter(target)
    heldout = seqs.split(heldout=True)
    before = evaluate_acceptance(drafter, target, heldout, CPU)
    config = TrainConfig(
        steps=80,
        batch_size=8,
        anchors_per_seq=16,
        lr=8e-3,
        warmup_steps=10,
        log_every=20,
        checkpoint_every=1000,
        objective=ObjectiveConfig(labels="soft"),
    )
    report = Trainer(drafter, target, seqs.split(heldout=False), config, tmp_path, CPU).run(progress=False)
    after = evaluate_acceptance(drafter, target, heldout, CPU)
    print(before.table(), after.table(), report, sep="\n")
    assert report.steps_done == 80 and report.stopped == "done"
    assert report.final_loss < 0.7 * report.first_loss
    chance = 1 + 1 / target.config.vocab_size
    assert before.greedy_accept_len < 2.5  # untrained: at most the first draft, by the anchor's embedding
    assert after.greedy_accept_len > 3.5 > chance + 2  # of at most gamma + 1 = 5
    assert after.greedy_per_position[1] > 0.6 > before.greedy_per_position[1] + 0.4
    assert after.sampled_accept_len > before.sampled_accept_len + 0.4
    assert after.greedy_verifies > 0 and after.sampled_anchors > 0
    assert (tmp_path / "train_log.jsonl").read_text().count("\n") == 4


def test_sigterm_checkpoint_resumes_to_the_same_weights(successor_data, tmp_path) -> None:
    target, seqs = successor_data
    train_set = seqs.split(heldout=False)
    config = TrainConfig(
        steps=12,
        batch_size=6,
        anchors_per_seq=8,
        lr=2e-3,
        warmup_steps=3,
        log_every=4,
        checkpoint_every=5,
        objective=ObjectiveConfig(labels="token"),
    )
    straight = new_drafter(target)
    Trainer(straight, target, train_set, config, tmp_path / "straight", CPU).run(progress=False)

    sent: list[int] = []

    def stop_once(drafter: DSparkDrafter, step: int) -> None:
        if step == 5 and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag; the loop stops after this step

    interrupted = Trainer(
        new_drafter(target), target, train_set, config, tmp_path / "resumed", CPU, on_checkpoint=stop_once
    ).run(progress=False)
    assert interrupted.stopped == "signal" and interrupted.steps_done == 5
    resumed_drafter = new_drafter(target, seed=123)  # different start: the state must overwrite it
    trainer = Trainer(resumed_drafter, target, train_set, config, tmp_path / "resumed", CPU)
    assert trainer.load_state() and trainer.step == 5
    report = trainer.run(progress=False)
    assert report.steps_done == 12 and report.stopped == "done"
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed_drafter.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_time_budget_sizes_the_run(successor_data, tmp_path) -> None:
    target, seqs = successor_data
    config = TrainConfig(steps=0, batch_size=4, anchors_per_seq=4, warmup_steps=2, log_every=5)
    trainer = Trainer(new_drafter(target), target, seqs.split(heldout=False), config, tmp_path, CPU)
    budget_s = 3.0
    start = time.monotonic()
    report = trainer.run(deadline=start + budget_s, progress=False)
    assert report.total_steps > 8  # sized after the timed calibration steps
    assert report.stopped in ("done", "deadline")
    assert time.monotonic() - start < budget_s + 1.5
    with pytest.raises(ValueError, match="deadline"):
        Trainer(new_drafter(target), target, seqs, config, tmp_path / "x", CPU).run(progress=False)


def test_time_budget_is_measured_again_after_slow_first_steps(successor_data, tmp_path) -> None:
    """The first steps of a GPU run are slow; sizing on them alone would plan far too few.
    The plan is judged against what this machine's own slow steps would have sized, so that
    a slower CPU (longer real steps) changes both sides alike."""
    target, seqs = successor_data
    config = TrainConfig(steps=0, batch_size=2, anchors_per_seq=2, warmup_steps=2, log_every=50)
    budget_s, slow_s, calibration = 4.0, 0.2, 8  # calibration: 2 untimed + 6 timed steps

    class SlowStart(Trainer):
        step_seconds: list[float] = []

        def train_step(self) -> dict[str, Any]:
            began = time.monotonic()
            time.sleep(slow_s if self.step < calibration else 0.0)
            result = super().train_step()
            self.step_seconds.append(time.monotonic() - began)
            return result

    trainer = SlowStart(new_drafter(target), target, seqs.split(heldout=False), config, tmp_path, CPU)
    start = time.monotonic()
    report = trainer.run(deadline=start + budget_s, progress=False)
    slow = trainer.step_seconds[:calibration]
    left_after_calibration = budget_s - sum(slow)
    first_sizing = calibration + int(0.95 * left_after_calibration / (sum(slow[2:]) / (calibration - 2)))
    assert report.total_steps > 1.5 * first_sizing, (report.total_steps, first_sizing)
    assert time.monotonic() - start < budget_s + 1.5


def test_learning_rate_schedule() -> None:
    config = TrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, 100, config) == pytest.approx(1e-4)
    assert lr_at(9, 100, config) == pytest.approx(1e-3)
    assert lr_at(55, 100, config) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(100, 100, config) == pytest.approx(1e-4)
    assert lr_at(3, 10, config) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 2 / 9)) * 0.9 + 1e-4)


def _stopped_at(step: int, target: torch.nn.Module, train_set: SequenceSet, config: TrainConfig, work) -> None:
    """Train `config` in `work` until SIGTERM after `step` steps (a checkpoint is due then)."""

    def stop(drafter: DSparkDrafter, at: int) -> None:
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)

    report = Trainer(new_drafter(target), target, train_set, config, work, CPU, on_checkpoint=stop).run(progress=False)
    assert report.stopped == "signal" and report.steps_done == step


def test_resume_takes_the_total_from_the_command_not_the_saved_state(successor_data, tmp_path) -> None:
    """Two calls make one schedule: the second call's `steps` is the whole run's total."""
    target, seqs = successor_data
    train_set = seqs.split(heldout=False)
    base = dict(batch_size=4, anchors_per_seq=4, lr=2e-3, warmup_steps=2, log_every=4, checkpoint_every=5)
    _stopped_at(5, target, train_set, TrainConfig(steps=8, **base), tmp_path)

    longer = TrainConfig(steps=14, **base)
    trainer = Trainer(new_drafter(target), target, train_set, longer, tmp_path, CPU)
    assert trainer.load_state() and (trainer.step, trainer.total_steps) == (5, 14)
    report = trainer.run(progress=False)
    assert (report.steps_done, report.total_steps, report.stopped) == (14, 14, "done")
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(13, 14, longer))

    with pytest.raises(ValueError, match="more than the 10 steps"):
        Trainer(new_drafter(target), target, train_set, TrainConfig(steps=10, **base), tmp_path, CPU).load_state()


def test_resume_with_steps_0_sizes_the_rest_to_the_new_deadline(successor_data, tmp_path) -> None:
    target, seqs = successor_data
    train_set = seqs.split(heldout=False)
    base = dict(batch_size=4, anchors_per_seq=4, warmup_steps=2, log_every=5, checkpoint_every=5)
    _stopped_at(5, target, train_set, TrainConfig(steps=12, **base), tmp_path)

    auto = TrainConfig(steps=0, **base)
    trainer = Trainer(new_drafter(target), target, train_set, auto, tmp_path, CPU)
    assert trainer.load_state() and (trainer.step, trainer.total_steps) == (5, 12)  # until sized again
    start = time.monotonic()
    report = trainer.run(deadline=start + 3.0, progress=False)
    assert report.total_steps > 20  # sized to the 3 s it was given, not the 12 saved
    assert report.stopped in ("done", "deadline") and report.steps_done > 12
    assert time.monotonic() - start < 3.0 + 1.5

    # Without a deadline there is nothing to size to: the saved total stands.
    again = Trainer(new_drafter(target), target, train_set, auto, tmp_path, CPU)
    again.load_state()
    done = again.run(progress=False)
    assert done.steps_done == done.total_steps == report.total_steps


def test_held_out_evaluation_runs_the_served_bf16_copy(successor_data, monkeypatch) -> None:
    """On GPU the fused kernels (RoPE, residual add + RMSNorm) need their inputs in one dtype;
    the fp32 training copy under bf16 autocast broke that. The pipeline evaluates the bf16 copy
    the engine would load; strict stand-ins for the kernels check the pairing on CPU."""
    import copy

    import engine.models.layers as layers
    from engine.kernels.rope import RotaryAngles
    from training.pipeline import served_drafter

    rotary, add_norm = RotaryAngles.__call__, layers.add_rms_norm

    def strict_rotary(self, q, k):
        assert q.dtype == k.dtype, f"rotary: q {q.dtype}, k {k.dtype}"
        return rotary(self, q, k)

    def strict_add_norm(x, residual, weight, eps):
        assert x.dtype == residual.dtype, f"add_rms_norm: x {x.dtype}, residual {residual.dtype}"
        return add_norm(x, residual, weight, eps)

    monkeypatch.setattr(RotaryAngles, "__call__", strict_rotary)
    monkeypatch.setattr(layers, "add_rms_norm", strict_add_norm)
    target, seqs = successor_data
    target = copy.deepcopy(target).to(torch.bfloat16)
    drafter = new_drafter(target, num_layers=2)
    served = served_drafter(drafter, CPU, torch.bfloat16)
    served.bind_target(target.embed, target.compute_logits)
    assert {p.dtype for p in served.parameters()} == {torch.bfloat16}
    assert served.rotary_emb.cos_sin_cache.dtype == torch.float32 and not served.training
    torch.testing.assert_close(served.fc.weight, drafter.fc.weight.to(torch.bfloat16))
    report = evaluate_acceptance(served, target, seqs.split(heldout=True), CPU, max_sequences=4)
    assert report.greedy_verifies > 0 and report.sampled_anchors > 0
