"""`dspark-serve bench`: load-test any OpenAI-compatible server (see services.bench)."""

from __future__ import annotations

import argparse

from services.cli import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from services.bench import add_arguments as add

    add(parser)


def run(args: argparse.Namespace) -> int:
    from services.bench import run as run_bench

    return run_bench(args)


COMMAND = Command(
    "bench",
    "load-test an OpenAI-compatible server (TTFT, TPOT, ITL, throughput)",
    add_arguments,
    run,
    order=3,
)
