"""`dspark-serve drain`: drain the worker actors on this node before it leaves the cluster (a
Ray worker pod's preStop, docs/design.md §6.9).

Each worker of the deployment whose node is this host stops taking requests (every gateway
routes around it), then has --shutdown-grace seconds to finish what it holds; what is still
running then goes back to its gateway, which moves it to another worker as a continuation.
Returns once every worker here is empty, so that `ray stop` after it cuts nothing.

`--worker NAME` drains the named workers instead, wherever they run: one replica of a node that
hosts several (a machine of several GPUs, `dspark-serve up`), to retire it or take it out of
service, while its neighbours keep serving.
"""

from __future__ import annotations

import argparse
import logging
import socket

from services.cli import Command
from services.cli._runtime import connect_ray, setup_logging
from services.cli.options import add_ray_options

log = logging.getLogger("dspark.drain")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="seconds the workers get to finish their requests before the rest move elsewhere (default: %(default)s)",
    )
    parser.add_argument(
        "--host",
        default=socket.gethostname(),
        help="drain the workers on the node of this hostname (default: this one, %(default)s)",
    )
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="NAME",
        help="drain the worker actor of this name (e.g. dspark-worker-1; repeatable) instead of every worker on --host",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning (default: %(default)s)")
    add_ray_options(parser, address_default="auto")


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    import ray

    from services.workers.deploy import list_workers
    from services.workers.types import WorkerInfo

    connect_ray(args.ray_address, args.namespace)
    deployed = sorted(list_workers(args.deployment))
    if args.worker:
        unknown = sorted(set(args.worker) - set(deployed))
        if unknown:
            raise SystemExit(
                f"dspark-serve drain: no worker named {', '.join(unknown)} in deployment {args.deployment!r} "
                f"(namespace {args.namespace!r}; its workers: {', '.join(deployed) or 'none'})"
            )
        here = [(ray.get_actor(name), name) for name in sorted(set(args.worker))]
    else:
        handles = [ray.get_actor(name) for name in deployed]
        infos: list[WorkerInfo] = ray.get([h.info.remote() for h in handles], timeout=30)
        here = [(h, info.replica_id) for h, info in zip(handles, infos, strict=True) if info.host == args.host]
        if not here:
            print(f"dspark-serve drain: no workers of {args.deployment!r} on {args.host}", flush=True)
            return 0
    names = ", ".join(name for _, name in here)
    log.info("draining %s (grace %.0f s)", names, args.shutdown_grace)
    ray.get([h.drain.remote(args.shutdown_grace) for h, _ in here], timeout=args.shutdown_grace + 30)
    print(f"dspark-serve drain: {names} drained", flush=True)
    return 0


COMMAND = Command(
    "drain",
    "drain this node's (or the named) workers: no new requests, a grace to finish, the rest moved elsewhere",
    add_arguments,
    run,
    order=3,
    description=__doc__,
)
