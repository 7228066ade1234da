"""The chart hands `dspark-serve` its settings as DSPARK_* variables (services/cli/env.py: every
`--foo-bar` is also `DSPARK_FOO_BAR`). Each variable a container gets must be an option of the
subcommand that container runs, with a value the option accepts."""

from __future__ import annotations

import argparse
from typing import Any

import deploy_support as ds
import pytest

from services.cli import build_parser
from services.cli.env import apply_env_defaults, env_var_for


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def option_variables(parser: argparse.ArgumentParser) -> set[str]:
    return {
        env_var_for(option)
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and not option.startswith("--no-")
    }


def dspark_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's DSPARK_* variables; one read from a Secret stands for a sample value."""
    env = {}
    for entry in container.get("env", []):
        if entry["name"].startswith("DSPARK_"):
            env[entry["name"]] = entry.get("value", "sample-secret-value")
    return env


def containers_running(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(subcommand, where, container) for every container that runs dspark-serve."""
    found = []
    gateway = ds.one(docs, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    found.append(("gateway", "gateway", gateway))
    for role in ("prefill", "decode"):
        (worker,) = ds.worker_group(docs, role)["template"]["spec"]["containers"]
        found.append(("worker", role, worker))
    planners = [d for d in ds.objects(docs, "Deployment") if d["metadata"]["name"].endswith("-planner")]
    for planner in planners:
        found.append(("planner", "planner", planner["spec"]["template"]["spec"]["containers"][0]))
    return found


@pytest.mark.parametrize("profile", [None, *ds.PROFILES])
def test_every_variable_is_an_option_with_a_valid_value(profile: str | None) -> None:
    commands = subcommands()
    docs = ds.render({"gateway": {"apiKeys": {"existingSecret": "keys"}}}, profile)
    checked = 0
    for command, where, container in containers_running(docs):
        if command not in commands:
            continue  # see test_planner_subcommand_takes_the_charts_variables
        parser = commands[command]
        env = dspark_env(container)
        unknown = set(env) - option_variables(parser)
        assert not unknown, f"{where}: `dspark-serve {command}` has no option for {sorted(unknown)}"
        apply_env_defaults(parser, environ=env)
        args = parser.parse_args([])
        checked += 1
        if command == "worker":
            assert args.role == where
            assert args.replicas >= 1 and args.tensor_parallel_size >= 1
            assert args.max_restarts == 0
        if command == "gateway":
            assert (args.host, args.port, args.ray_address) == ("0.0.0.0", 8000, "auto")
    assert checked >= 3


def test_planner_subcommand_takes_the_charts_variables() -> None:
    commands = subcommands()
    (_, _, container) = [c for c in containers_running(ds.render()) if c[0] == "planner"][0]
    unknown = set(dspark_env(container)) - option_variables(commands["planner"])
    assert not unknown, f"`dspark-serve planner` has no option for {sorted(unknown)}"
