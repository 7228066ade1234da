"""`dspark-serve train-drafter`: registered here, implemented in `services.cli_train`."""

from __future__ import annotations

import argparse

from services.cli import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from services.cli_train import configure_parser

    configure_parser(parser)


def run(args: argparse.Namespace) -> int:
    from services.cli_train import run as run_training

    return int(run_training(args))


def _description() -> str | None:
    from services import cli_train

    return cli_train.__doc__


COMMAND = Command(
    "train-drafter",
    "train a DSpark drafter for a target model",
    add_arguments,
    run,
    order=4,
    description=_description(),
    env_prefix=None,  # services.cli_train reads DSPARK_TRAIN_* itself
)
