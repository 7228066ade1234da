"""`dspark-serve gateway`: the HTTP gateway, against workers in an existing Ray cluster."""

from __future__ import annotations

import argparse

from services.cli import Command
from services.cli._runtime import connect_ray, describe_pool, serve_gateway, setup_logging
from services.cli.options import add_gateway_options, add_ray_options, gateway_config_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_gateway_options(parser)
    add_ray_options(parser, address_default="auto")


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from services.gateway import create_app
    from services.gateway.pool import RayDiscovery

    connect_ray(args.ray_address, args.namespace)
    app = create_app(RayDiscovery(args.deployment), gateway_config_from_args(args))
    print(
        f"dspark-serve gateway listening on http://{args.host}:{args.port}/v1; workers: deployment "
        f"{args.deployment!r} in Ray namespace {args.namespace!r}",
        flush=True,
    )

    def ready_line() -> str:
        info = app.state.gateway.pool.any_info()
        model = info.model_name if info else "?"
        url = f"http://{args.host}:{args.port}/v1"
        return f"dspark-serve ready: {url}  model={model}  workers: {describe_pool(app)}"

    return serve_gateway(app, args, ready_line)


COMMAND = Command(
    "gateway",
    "run the OpenAI-compatible gateway against workers in a Ray cluster",
    add_arguments,
    run,
    order=1,
)
