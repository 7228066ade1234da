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

from services.cli.env import ENV_PREFIX, apply_env_defaults

# modules of this package that are no subcommand
_OPTION_MODULES = {"env", "options", "reliability_options", "vllm_options"}


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    order: int = 100  # position in --help
    description: str | None = None  # long help (shown verbatim); default: `help`
    env_prefix: str = ENV_PREFIX  # its options' variables are <prefix><OPTION>
    # Rules across options, applied after parsing; a ValueError is reported as a usage error.
    check: Callable[[argparse.Namespace], object] | None = None


def discover_commands() -> list[Command]:
    commands: list[Command] = []
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("_") or module_info.name in _OPTION_MODULES:
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
        sub.set_defaults(_run=command.run, _check=command.check)
        apply_env_defaults(sub, environ, prefix=command.env_prefix)
    return parser


def parse_command_line(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """The parsed command line, once its subcommand's rules across options hold; a usage error
    (exit status 2, the subcommand's usage on stderr) where they do not."""
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    if args._check is not None:
        try:
            args._check(args)
        except ValueError as exc:
            (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            subcommands.choices[args.command].error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
