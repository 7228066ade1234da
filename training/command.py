"""The drafter-training run as a command: its options on an argparse parser, the `RunConfig`
they make, and `run(args)`, which trains and prints a one-line summary (exit status 2 on bad
input). The options' environment variables are the caller's concern (services.cli)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from engine.loader.resolve import ModelNotFoundError
from engine.speculative.drafter_config import DEFAULT_GAMMA, DEFAULT_MARKOV_RANK
from engine.speculative.weight_encoding import WEIGHT_ENCODINGS
from training.generate import GenerationPlan
from training.objective import LABEL_MODES, ObjectiveConfig
from training.pipeline import RunConfig
from training.pipeline import run as run_pipeline
from training.trainer import TrainConfig


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _option(
    group: argparse._ArgumentGroup,
    option: str,
    kind: Callable[[str], object],
    default: object,
    help: str,
    choices: tuple[str, ...] | None = None,
) -> None:
    shown = "" if default is None else " (default: %(default)s)"
    group.add_argument(option, type=kind, default=default, choices=choices, help=help + shown)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run, gen, train, objective = RunConfig(), GenerationPlan(), TrainConfig(), ObjectiveConfig()
    where = parser.add_argument_group("target and output")
    _option(where, "--model", str, run.model, "target: alias, GGUF file or Hugging Face directory")
    where.add_argument(
        "--out", required=True, help="directory for the drafter checkpoint (drafter.json + drafter.safetensors)"
    )
    _option(where, "--work-dir", str, None, "generated data, training state and logs (default: <out>-work)")
    _option(where, "--device", str, run.device, "auto, cpu, cuda or cuda:N")
    _option(where, "--target-name", str, None, "target name recorded in the checkpoint (default: --model)")
    where.add_argument(
        "--resume", action="store_true", help="continue the run in --work-dir (reuse its data and training state)"
    )

    shape = parser.add_argument_group("drafter")
    _option(shape, "--gamma", int, DEFAULT_GAMMA, "draft tokens per block")
    _option(shape, "--layers", int, run.layers, "drafter layers (1-3)")
    _option(shape, "--markov-rank", int, DEFAULT_MARKOV_RANK, "rank of the Markov head's bigram bias")
    _option(
        shape,
        "--capture-layers",
        _ints,
        None,
        "target layer ids read by the drafter, comma-separated (default: spread over the depth)",
    )
    _option(
        shape,
        "--init",
        str,
        run.init,
        "initial weights: 'target' (copy the last target layers) or 'random'",
        choices=("target", "random"),
    )
    _option(
        shape,
        "--init-from",
        str,
        None,
        "a trained drafter checkpoint to start from, applied after --init; --layers may exceed its "
        "depth (the added layers start as identities)",
    )
    _option(
        shape,
        "--weight-encoding",
        str,
        run.weight_encoding,
        "how the checkpoint stores its matrices: plain (bf16) or int8 (per-group scales, half the size)",
        choices=WEIGHT_ENCODINGS,
    )

    data = parser.add_argument_group("data")
    _option(data, "--num-prompts", int, run.num_prompts, "prompts from the built-in set")
    _option(
        data,
        "--temperatures",
        _floats,
        ",".join(f"{t:g}" for t in gen.temperatures),
        "answers per prompt, one per temperature (0 = greedy), comma-separated",
    )
    _option(
        data,
        "--samples-per-temperature",
        int,
        gen.samples_per_temperature,
        "answers per prompt at each temperature above 0, each with its own seed",
    )
    _option(data, "--max-new-tokens", int, gen.max_new_tokens, "answer length limit")
    _option(data, "--max-prompt-tokens", int, gen.max_prompt_tokens, "longer prompts are skipped")
    _option(data, "--heldout-permille", int, gen.heldout_permille, "share of prompts held out for evaluation")
    _option(data, "--chunk-size", int, gen.chunk_size, "generation jobs per data shard")
    _option(
        data,
        "--generator",
        str,
        run.generator,
        "answer generator: engine (engine.LLM), dense, or auto (engine, falling back to dense)",
        choices=("auto", "engine", "dense"),
    )
    _option(data, "--generator-batch", int, run.generator_batch, "sequences decoded together")
    _option(data, "--corpus", str, None, "a plain-text file to train on as well")
    _option(data, "--corpus-max-tokens", int, run.corpus_max_tokens, "tokens taken from --corpus")
    _option(data, "--data-seed", int, gen.seed, "seed of the prompt set and the sampled answers")

    opt = parser.add_argument_group("training")
    _option(
        opt,
        "--steps",
        int,
        train.steps,
        "optimizer steps of the whole run, also on --resume; 0 = as many as fit in the time budget "
        "(on --resume: sized again to this call's budget)",
    )
    _option(opt, "--batch-size", int, train.batch_size, "sequences per step")
    _option(opt, "--anchors-per-seq", int, train.anchors_per_seq, "draft blocks trained per sequence per step")
    _option(opt, "--max-seq-len", int, train.max_seq_len, "sequences are truncated to this many tokens")
    _option(opt, "--lr", float, train.lr, "peak learning rate (AdamW)")
    _option(opt, "--min-lr-ratio", float, train.min_lr_ratio, "final learning rate / peak")
    _option(opt, "--warmup-steps", int, train.warmup_steps, "linear warmup steps")
    _option(opt, "--weight-decay", float, train.weight_decay, "AdamW weight decay (matrices only)")
    _option(opt, "--grad-clip", float, train.grad_clip, "gradient norm clip")
    _option(
        opt,
        "--labels",
        str,
        objective.labels,
        "targets: soft (the target's distribution), argmax, token",
        choices=LABEL_MODES,
    )
    _option(opt, "--position-decay", float, objective.position_decay, "loss weight of block row i is decay**i")
    _option(opt, "--confidence-weight", float, objective.confidence_weight, "weight of the confidence-head loss")
    _option(opt, "--checkpoint-every", int, train.checkpoint_every, "steps between checkpoints")
    _option(opt, "--log-every", int, train.log_every, "steps between log lines (train_log.jsonl)")
    _option(opt, "--seed", int, train.seed, "training seed")

    ev = parser.add_argument_group("evaluation and time")
    _option(ev, "--eval-sequences", int, run.eval_sequences, "held-out sequences per evaluation mode")
    _option(
        ev,
        "--eval-temperature",
        float,
        run.eval_temperature,
        "temperature of the sampled-acceptance estimate",
    )
    _option(ev, "--max-minutes", float, None, "time budget of the whole run (required when --steps is 0)")
    _option(ev, "--gen-minutes", float, None, "generation budget (default: 35%% of --max-minutes)")
    _option(ev, "--eval-minutes", float, None, "time kept for evaluation (default: 10%% of --max-minutes, <= 1.5)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bars")
    _option(ev, "--log-level", str, "INFO", "logging level")


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's configuration from parsed options (ValueError on inconsistent ones)."""
    if args.steps == 0 and args.max_minutes is None:
        raise ValueError("--steps 0 sizes training to the time budget: give --max-minutes, or a number of --steps")
    plan = GenerationPlan(
        temperatures=tuple(args.temperatures),
        samples_per_temperature=args.samples_per_temperature,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        heldout_permille=args.heldout_permille,
        chunk_size=args.chunk_size,
        seed=args.data_seed,
    )
    objective = ObjectiveConfig(
        labels=args.labels, position_decay=args.position_decay, confidence_weight=args.confidence_weight
    )
    train = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        anchors_per_seq=args.anchors_per_seq,
        max_seq_len=args.max_seq_len,
        lr=args.lr,
        min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        seed=args.seed,
        objective=objective,
    )
    return RunConfig(
        model=args.model,
        out=args.out,
        work_dir=args.work_dir,
        device=args.device,
        target_name=args.target_name,
        gamma=args.gamma,
        layers=args.layers,
        markov_rank=args.markov_rank,
        capture_layers=tuple(args.capture_layers or ()),
        init=args.init,
        init_from=args.init_from,
        weight_encoding=args.weight_encoding,
        num_prompts=args.num_prompts,
        generation=plan,
        generator=args.generator,
        generator_batch=args.generator_batch,
        corpus=args.corpus,
        corpus_max_tokens=args.corpus_max_tokens,
        train=train,
        eval_sequences=args.eval_sequences,
        eval_temperature=args.eval_temperature,
        max_minutes=args.max_minutes,
        gen_minutes=args.gen_minutes,
        eval_minutes=args.eval_minutes,
        resume=args.resume,
        progress=not args.no_progress,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        result = run_pipeline(run_config(args))
    except (ValueError, ModelNotFoundError, FileNotFoundError) as e:
        print(f"train-drafter: error: {e}", file=sys.stderr)
        return 2
    acceptance = result.acceptance
    summary = f"drafter written to {result.out}: {result.train.steps_done} steps ({result.train.stopped})"
    if acceptance is not None:
        summary += (
            f", held-out tokens/verify {acceptance.greedy_accept_len:.2f} greedy, "
            f"{acceptance.sampled_accept_len:.2f} at T={acceptance.sampled_temperature:g}"
        )
    print(summary, flush=True)
    return 0
