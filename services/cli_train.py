"""`dspark-serve train-drafter`: train a DSpark drafter for a target model (DESIGN.md §3).

    dspark-serve train-drafter --model smollm2-135m --out DIR --gamma 7 --layers 1 \\
        --markov-rank 64 --num-prompts 6000 --max-new-tokens 256 --max-minutes 9 --device auto

The target answers a built-in prompt set (greedy and sampled), the drafter is distilled from
its hidden states and next-token distributions, and the held-out acceptance is measured and
stored in DIR/drafter.json. Everything else (generated data, training state, logs) goes to
--work-dir (default DIR-work); --resume continues a stopped run from there.

Every option can also be set by an environment variable, DSPARK_TRAIN_<OPTION> with dashes
as underscores (DSPARK_TRAIN_MAX_MINUTES=9); the command line wins.

`add_parser(subparsers)` registers the subcommand on the main CLI; `python -m
services.cli_train train-drafter ...` runs it alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

ENV_PREFIX = "DSPARK_TRAIN_"


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def env_name(option: str) -> str:
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def _add(
    parser: argparse._ActionsContainer,
    option: str,
    kind: Callable[[str], Any],
    default: Any,
    help: str,
    **kwargs: Any,
) -> None:
    """An option whose default comes from its DSPARK_TRAIN_* variable when that is set."""
    env = env_name(option)
    raw = os.environ.get(env)
    if raw is not None:
        try:
            default = kind(raw)
        except ValueError as e:
            raise SystemExit(f"train-drafter: error: {env}={raw!r}: {e}") from None
    shown = "" if default is None else f" (default: {default})"
    parser.add_argument(option, type=kind, default=default, help=f"{help}{shown} [env {env}]", **kwargs)


def _add_flag(parser: argparse._ActionsContainer, option: str, help: str) -> None:
    env = env_name(option)
    default = _bool(os.environ.get(env, "0"))
    parser.add_argument(option, action="store_true", default=default, help=f"{help} [env {env}]")


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from engine.speculative.drafter_config import DEFAULT_GAMMA, DEFAULT_MARKOV_RANK
    from engine.speculative.weight_encoding import WEIGHT_ENCODINGS
    from training.generate import GenerationPlan
    from training.objective import LABEL_MODES, ObjectiveConfig
    from training.pipeline import RunConfig
    from training.trainer import TrainConfig

    run, gen, train, objective = RunConfig(), GenerationPlan(), TrainConfig(), ObjectiveConfig()
    where = parser.add_argument_group("target and output")
    _add(where, "--model", str, run.model, "target: alias, GGUF file or Hugging Face directory")
    _add(
        where,
        "--out",
        str,
        None,
        "directory for the drafter checkpoint (drafter.json + drafter.safetensors)",
        required=os.environ.get(env_name("--out")) is None,
    )
    _add(where, "--work-dir", str, None, "generated data, training state and logs (default: <out>-work)")
    _add(where, "--device", str, run.device, "auto, cpu, cuda or cuda:N")
    _add(where, "--target-name", str, None, "target name recorded in the checkpoint (default: --model)")
    _add_flag(where, "--resume", "continue the run in --work-dir (reuse its data and training state)")

    shape = parser.add_argument_group("drafter")
    _add(shape, "--gamma", int, DEFAULT_GAMMA, "draft tokens per block")
    _add(shape, "--layers", int, run.layers, "drafter layers (1-3)")
    _add(shape, "--markov-rank", int, DEFAULT_MARKOV_RANK, "rank of the Markov head's bigram bias")
    _add(
        shape,
        "--capture-layers",
        _ints,
        None,
        "target layer ids read by the drafter, comma-separated (default: spread over the depth)",
    )
    _add(
        shape,
        "--init",
        str,
        run.init,
        "initial weights: 'target' (copy the last target layers) or 'random'",
        choices=("target", "random"),
    )
    _add(
        shape,
        "--init-from",
        str,
        None,
        "a trained drafter checkpoint to start from, applied after --init; --layers may exceed its "
        "depth (the added layers start as identities)",
    )
    _add(
        shape,
        "--weight-encoding",
        str,
        run.weight_encoding,
        "how the checkpoint stores its matrices: plain (bf16) or int8 (per-group scales, half the size)",
        choices=WEIGHT_ENCODINGS,
    )

    data = parser.add_argument_group("data")
    _add(data, "--num-prompts", int, run.num_prompts, "prompts from the built-in set")
    _add(
        data,
        "--temperatures",
        _floats,
        ",".join(f"{t:g}" for t in gen.temperatures),
        "answers per prompt, one per temperature (0 = greedy), comma-separated",
    )
    _add(
        data,
        "--samples-per-temperature",
        int,
        gen.samples_per_temperature,
        "answers per prompt at each temperature above 0, each with its own seed",
    )
    _add(data, "--max-new-tokens", int, gen.max_new_tokens, "answer length limit")
    _add(data, "--max-prompt-tokens", int, gen.max_prompt_tokens, "longer prompts are skipped")
    _add(data, "--heldout-permille", int, gen.heldout_permille, "share of prompts held out for evaluation")
    _add(data, "--chunk-size", int, gen.chunk_size, "generation jobs per data shard")
    _add(
        data,
        "--generator",
        str,
        run.generator,
        "answer generator: engine (engine.LLM), dense, or auto (engine, falling back to dense)",
        choices=("auto", "engine", "dense"),
    )
    _add(data, "--generator-batch", int, run.generator_batch, "sequences decoded together")
    _add(data, "--corpus", str, None, "a plain-text file to train on as well")
    _add(data, "--corpus-max-tokens", int, run.corpus_max_tokens, "tokens taken from --corpus")
    _add(data, "--data-seed", int, gen.seed, "seed of the prompt set and the sampled answers")

    opt = parser.add_argument_group("training")
    _add(
        opt,
        "--steps",
        int,
        train.steps,
        "optimizer steps of the whole run, also on --resume; 0 = as many as fit in the time budget "
        "(on --resume: sized again to this call's budget)",
    )
    _add(opt, "--batch-size", int, train.batch_size, "sequences per step")
    _add(opt, "--anchors-per-seq", int, train.anchors_per_seq, "draft blocks trained per sequence per step")
    _add(opt, "--max-seq-len", int, train.max_seq_len, "sequences are truncated to this many tokens")
    _add(opt, "--lr", float, train.lr, "peak learning rate (AdamW)")
    _add(opt, "--min-lr-ratio", float, train.min_lr_ratio, "final learning rate / peak")
    _add(opt, "--warmup-steps", int, train.warmup_steps, "linear warmup steps")
    _add(opt, "--weight-decay", float, train.weight_decay, "AdamW weight decay (matrices only)")
    _add(opt, "--grad-clip", float, train.grad_clip, "gradient norm clip")
    _add(
        opt,
        "--labels",
        str,
        objective.labels,
        "targets: soft (the target's distribution), argmax, token",
        choices=LABEL_MODES,
    )
    _add(opt, "--position-decay", float, objective.position_decay, "loss weight of block row i is decay**i")
    _add(opt, "--confidence-weight", float, objective.confidence_weight, "weight of the confidence-head loss")
    _add(opt, "--checkpoint-every", int, train.checkpoint_every, "steps between checkpoints")
    _add(opt, "--log-every", int, train.log_every, "steps between log lines (train_log.jsonl)")
    _add(opt, "--seed", int, train.seed, "training seed")

    ev = parser.add_argument_group("evaluation and time")
    _add(ev, "--eval-sequences", int, run.eval_sequences, "held-out sequences per evaluation mode")
    _add(
        ev,
        "--eval-temperature",
        float,
        run.eval_temperature,
        "temperature of the sampled-acceptance estimate",
    )
    _add(ev, "--max-minutes", float, None, "time budget of the whole run (required when --steps is 0)")
    _add(ev, "--gen-minutes", float, None, "generation budget (default: 35%% of --max-minutes)")
    _add(ev, "--eval-minutes", float, None, "time kept for evaluation (default: 10%% of --max-minutes, <= 1.5)")
    _add_flag(ev, "--no-progress", "no progress bars")
    _add(ev, "--log-level", str, "INFO", "logging level")
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `train-drafter` on the main CLI's subparsers; its handler is `run`."""
    parser = subparsers.add_parser(
        "train-drafter",
        help="train a DSpark drafter for a target model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(parser)
    parser.set_defaults(func=run, handler=run)
    return parser


def run_config(args: argparse.Namespace) -> Any:
    """The engine's RunConfig from parsed arguments (ValueError on inconsistent ones)."""
    from training.generate import GenerationPlan
    from training.objective import ObjectiveConfig
    from training.pipeline import RunConfig
    from training.trainer import TrainConfig

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
    from engine.loader.resolve import ModelNotFoundError
    from training.pipeline import run as run_pipeline

    try:
        config = run_config(args)
        result = run_pipeline(config)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.cli_train")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
