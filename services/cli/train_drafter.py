"""`dspark-serve train-drafter`: train a DSpark drafter for a target model (docs/design.md §3).

    dspark-serve train-drafter --model smollm2-135m --out DIR --gamma 7 --layers 1 \\
        --markov-rank 64 --num-prompts 6000 --max-new-tokens 256 --max-minutes 9 --device auto

The target answers a built-in prompt set (greedy and sampled), the drafter is distilled from
its hidden states and next-token distributions, and the held-out acceptance is measured and
stored in DIR/drafter.json. Everything else (generated data, training state, logs) goes to
--work-dir (default DIR-work); --resume continues a stopped run from there.

Every option can also be set by an environment variable, DSPARK_TRAIN_<OPTION> with dashes
as underscores (DSPARK_TRAIN_MAX_MINUTES=9); the command line wins.
"""

from __future__ import annotations

import argparse

from services.cli import Command

ENV_PREFIX = "DSPARK_TRAIN_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from training.command import add_arguments as add

    add(parser)


def run(args: argparse.Namespace) -> int:
    from training.command import run as run_training

    return run_training(args)


COMMAND = Command(
    "train-drafter",
    "train a DSpark drafter for a target model",
    add_arguments,
    run,
    order=4,
    description=__doc__,
    env_prefix=ENV_PREFIX,
)
