"""`dspark-serve up`: everything on one machine (a local Ray cluster, workers, gateway)."""

from __future__ import annotations

import argparse
import contextlib
import logging

from services.cli import Command
from services.cli._runtime import connect_ray, describe_pool, serve_gateway, setup_logging, wait_for_workers
from services.cli.options import (
    add_engine_options,
    add_gateway_options,
    add_ray_options,
    add_worker_options,
    engine_config_from_args,
    gateway_config_from_args,
    worker_options_from_args,
)
from services.workers.types import Role

logger = logging.getLogger("dspark")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology")
    group.add_argument(
        "--colocated",
        action="store_true",
        help="one pool of workers that prefill and decode (default: disaggregated)",
    )
    group.add_argument("--workers", type=int, default=1, help="colocated workers (default: %(default)s)")
    group.add_argument("--prefill-workers", type=int, default=1, help="prefill workers (default: %(default)s)")
    group.add_argument("--decode-workers", type=int, default=1, help="decode workers (default: %(default)s)")
    group.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all)")
    add_engine_options(parser)
    add_gateway_options(parser)
    add_ray_options(parser, address_default=None)
    add_worker_options(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    import ray

    from services.gateway import create_app
    from services.gateway.pool import RayDiscovery
    from services.workers.deploy import spawn_workers

    engine_config = engine_config_from_args(args)
    gateway_config = gateway_config_from_args(args)
    options = worker_options_from_args(args, detached=False)
    topology: list[tuple[Role, int]] = (
        [("worker", args.workers)]
        if args.colocated
        else [("prefill", args.prefill_workers), ("decode", args.decode_workers)]
    )
    if any(n < 1 for _, n in topology):
        raise SystemExit("dspark-serve up: every pool needs at least one worker")
    init: dict[str, object] = {"num_cpus": args.num_cpus} if args.num_cpus else {}
    connect_ray(args.ray_address, args.namespace, **init)
    spec = "dspark" if engine_config.speculative is not None else "off"
    logger.info(
        "starting %s with model %s (speculative: %s)",
        " + ".join(f"{n} {role}" for role, n in topology),
        engine_config.model,
        spec,
    )
    handles: dict[str, object] = {}
    try:
        for role, replicas in topology:
            handles.update(
                spawn_workers(
                    role,
                    replicas,
                    engine_config,
                    options,
                    deployment=args.deployment,
                )
            )
        wait_for_workers(handles, args.ready_timeout, f"loading {engine_config.model}")
        app = create_app(RayDiscovery(args.deployment), gateway_config)

        def ready_line() -> str:
            return (
                f"dspark-serve ready: http://{args.host}:{args.port}/v1  model={engine_config.model}  "
                f"workers: {describe_pool(app)}  speculative={spec}"
            )

        return serve_gateway(app, args, ready_line)
    finally:
        for handle in handles.values():
            with contextlib.suppress(Exception):  # already gone
                ray.kill(handle, no_restart=True)  # type: ignore[arg-type]
        ray.shutdown()


COMMAND = Command(
    "up",
    "run everything on this machine: local Ray cluster, workers and gateway",
    add_arguments,
    run,
    order=0,
    check=engine_config_from_args,
)
