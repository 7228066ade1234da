"""`DSPARK_*` environment variables as the defaults of the command-line options.

Every long option `--foo-bar` can also be set as `DSPARK_FOO_BAR` (the Helm chart sets
options that way); an option spelled two ways (`--prefix-cache`, `--enable-prefix-caching`)
reads both variables. Precedence: command line, then environment, then the default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "DSPARK_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_var_for(option: str, prefix: str = ENV_PREFIX) -> str:
    """`--foo-bar` -> `DSPARK_FOO_BAR`."""
    return prefix + option.lstrip("-").replace("-", "_").upper()


def long_options(action: argparse.Action) -> list[str]:
    """The options that name a variable: every `--foo`, less the `--no-foo` of `--foo/--no-foo`."""
    negated = isinstance(action, argparse.BooleanOptionalAction)
    return [
        option
        for option in action.option_strings
        if option.startswith("--") and not (negated and option.startswith("--no-"))
    ]


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")


def _convert(action: argparse.Action, text: str) -> Any:
    if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
        return _parse_bool(text)
    if isinstance(action, argparse._StoreFalseAction):
        return not _parse_bool(text)
    if isinstance(action, argparse._StoreConstAction):
        return action.const if _parse_bool(text) else action.default
    convert = action.type if callable(action.type) else str
    values: Any
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        values = [convert(item.strip()) for item in text.split(",") if item.strip()]
    else:
        values = convert(text)
    candidates = values if isinstance(values, list) else [values]
    if action.choices is not None:
        for value in candidates:
            if value not in action.choices:
                raise ValueError(f"{value!r} is not one of {sorted(map(str, action.choices))}")
    return values


def apply_env_defaults(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None, prefix: str = ENV_PREFIX
) -> None:
    """Make `DSPARK_*` variables the defaults of the matching options (recursing into
    subcommands), and name the variables in each option's help."""
    env = os.environ if environ is None else environ
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_env_defaults(sub, env, prefix)
            continue
        names = [env_var_for(option, prefix) for option in long_options(action)]
        if not names or action.dest == "help":
            continue
        if action.help is not argparse.SUPPRESS:
            action.help = f"{action.help or ''} [env: {', '.join(names)}]".strip()
        values: dict[str, Any] = {}
        for name in names:
            if name not in env:
                continue
            try:
                values[name] = _convert(action, env[name])
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                parser.error(f"environment variable {name}={env[name]!r}: {exc}")
        if len({repr(value) for value in values.values()}) > 1:
            given = " and ".join(f"{name}={env[name]!r}" for name in values)
            parser.error(f"environment variables {given} set one option to different values")
        if values:
            action.default = next(iter(values.values()))
            action.required = False
