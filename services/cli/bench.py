"""`dspark-serve bench`: load-test any OpenAI-compatible server (see services.bench).

Its options read their own environment variables, DSPARK_BENCH_<OPTION> with dashes as
underscores (DSPARK_BENCH_CONCURRENCY=1,8, DSPARK_BENCH_API_KEY=...), so the variables
that configure a server on the same machine (DSPARK_MODEL, DSPARK_PORT, ...) never change
what the load generator does; the command line wins.
"""

from __future__ import annotations

import argparse

from services.cli import Command

ENV_PREFIX = "DSPARK_BENCH_"


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
    env_prefix=ENV_PREFIX,
)
