"""`dspark-serve`: one entry point, one module per subcommand.

A subcommand is a module in this package that defines `COMMAND = Command(...)`; it is found
by scanning the package, so adding a subcommand (train-drafter, planner, ...) means adding
one module and touching nothing else. Modules import their heavy dependencies inside
`run`, so `dspark-serve --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from services.cli.options import ENV_PREFIX, apply_env_defaults


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    order: int = 100  # position in --help
    description: str | None = None  # long help (shown verbatim); default: `help`
    env_prefix: str = ENV_PREFIX  # its options' variables are <prefix><OPTION>


def discover_commands() -> list[Command]:
    commands: list[Command] = []
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("_") or module_info.name == "options":
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        command = getattr(module, "COMMAND", None)
        if isinstance(command, Command):
            commands.append(command)
    return sorted(commands, key=lambda c: (c.order, c.name))


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark-serve",
        description="LLM serving with DSpark speculative decoding. "
        "Every --option can also be set as a DSPARK_OPTION environment variable.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in discover_commands():
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            formatter_class=argparse.RawDescriptionHelpFormatter if command.description else argparse.HelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run)
        apply_env_defaults(sub, environ, prefix=command.env_prefix)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
