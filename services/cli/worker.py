"""`dspark-serve worker`: start named, detached worker actors in an existing Ray cluster.

The gateway finds them by name (`<deployment>-<role>-<index>` in the namespace), so this
command may run any number of times to add replicas; it returns once they are ready.
"""

from __future__ import annotations

import argparse

from services.cli import Command
from services.cli._runtime import connect_ray, setup_logging, wait_for_workers
from services.cli.options import (
    add_engine_options,
    add_ray_options,
    add_worker_options,
    engine_config_from_args,
    worker_options_from_args,
)
from services.cli.worker_checks import check_speculative, require_visible_gpus
from services.workers.types import Role

ROLE_NAMES: dict[str, Role] = {"prefill": "prefill", "decode": "decode", "colocated": "worker"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--role",
        choices=sorted(ROLE_NAMES),
        default="colocated",
        help="what the workers do (default: %(default)s)",
    )
    parser.add_argument("--replicas", type=int, default=1, help="workers to start (default: %(default)s)")
    parser.add_argument(
        "--pin-to-node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="place the workers on the Ray node this command runs on (default: on; off: anywhere)",
    )
    parser.add_argument(
        "--require-gpus",
        type=int,
        default=0,
        help="exit before loading anything unless torch sees at least this many GPUs (the Helm chart "
        "sets the pod's GPU count; default: %(default)s, no requirement)",
    )
    parser.add_argument(
        "--gpu-resource",
        default="",
        help="the Kubernetes resource the pod requested its GPUs as (e.g. amd.com/gpu), named when "
        "--require-gpus fails",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning (default: %(default)s)")
    add_engine_options(parser)
    add_ray_options(parser, address_default="auto")
    add_worker_options(parser)


def check_options(args: argparse.Namespace) -> None:
    """Before anything loads: the GPUs the pod requested are visible (their own message, which
    names the device plugin to check), then the engine options hold together."""
    require_visible_gpus(args.require_gpus, args.gpu_resource)
    engine_config_from_args(args)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from services.workers.deploy import spawn_workers

    if args.replicas < 1:
        raise SystemExit("dspark-serve worker: --replicas must be >= 1")
    engine_config = engine_config_from_args(args)
    check_speculative(engine_config)
    connect_ray(args.ray_address, args.namespace)
    role = ROLE_NAMES[args.role]
    handles = spawn_workers(
        role,
        args.replicas,
        engine_config,
        worker_options_from_args(args, detached=True, pin_to_local_node=args.pin_to_node),
        deployment=args.deployment,
    )
    wait_for_workers(handles, args.ready_timeout, f"loading {engine_config.model}")
    print(
        f"dspark-serve worker: {', '.join(sorted(handles))} ready (role {args.role}, model "
        f"{engine_config.model}, namespace {args.namespace!r})",
        flush=True,
    )
    return 0


COMMAND = Command(
    "worker",
    "start prefill, decode or colocated workers in an existing Ray cluster",
    add_arguments,
    run,
    order=2,
    check=check_options,
)
