"""`dspark-serve planner`: resize the prefill and decode worker groups from TTFT/TPOT.

Every --interval-s: read the signals from Prometheus, decide per group
(services/planner/policy.py), patch the RayCluster's worker-group replicas. A decrease first
drains the least-loaded workers, reached through --ray-address, and removes exactly those
(services/planner/drain.py); without --ray-address decreases are held. A failed read or patch
is logged and the groups are held until the next interval.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from typing import TYPE_CHECKING

from services.cli import Command

if TYPE_CHECKING:
    from services.planner.policy import PolicyConfig

log = logging.getLogger("dspark.planner")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sources = parser.add_argument_group("sources")
    sources.add_argument(
        "--prometheus-url", default="http://127.0.0.1:9090", help="Prometheus base URL (default: %(default)s)"
    )
    sources.add_argument("--model", default="", help="regex on the `model` label (default: every model)")
    sources.add_argument(
        "--metrics-selector", default="", help="extra PromQL label matchers, e.g. 'namespace=\"serving\"'"
    )
    sources.add_argument("--window", default="2m", help="rate window of the p95 latencies (default: %(default)s)")
    sources.add_argument(
        "--kube-namespace", default="default", help="namespace of the RayCluster (default: %(default)s)"
    )
    sources.add_argument("--raycluster", default="dspark", help="RayCluster name (default: %(default)s)")
    sources.add_argument(
        "--kube-host",
        default=None,
        help="Kubernetes API URL, without credentials (default: in-cluster config, else kubeconfig)",
    )
    sources.add_argument(
        "--ray-address",
        default="",
        help="Ray Client address of the cluster (ray://<head>:10001), to pick and drain the workers a "
        "decrease removes (default: none; decreases are held)",
    )
    sources.add_argument(
        "--ray-namespace", default="dspark", help="Ray namespace of the workers (default: %(default)s)"
    )
    sources.add_argument("--deployment", default="dspark", help="name prefix of the worker actors (default: dspark)")
    sources.add_argument("--prefill-group", default="prefill", help="prefill worker group (default: prefill)")
    sources.add_argument("--decode-group", default="decode", help="decode worker group (default: decode)")

    bounds = parser.add_argument_group("bounds and targets")
    bounds.add_argument("--prefill-min-replicas", type=int, default=1, help="(default: %(default)s)")
    bounds.add_argument("--prefill-max-replicas", type=int, default=4, help="(default: %(default)s)")
    bounds.add_argument("--decode-min-replicas", type=int, default=1, help="(default: %(default)s)")
    bounds.add_argument("--decode-max-replicas", type=int, default=4, help="(default: %(default)s)")
    bounds.add_argument("--ttft-target-s", type=float, default=2.0, help="TTFT p95 target (default: %(default)s)")
    bounds.add_argument("--tpot-target-s", type=float, default=0.1, help="TPOT p95 target (default: %(default)s)")

    policy = parser.add_argument_group("policy")
    policy.add_argument(
        "--scale-up-ratio",
        type=float,
        default=1.0,
        help="scale up above this x target (default: %(default)s)",
    )
    policy.add_argument(
        "--scale-down-ratio",
        type=float,
        default=0.5,
        help="scale down only below this x target (default: %(default)s)",
    )
    policy.add_argument(
        "--queue-per-replica",
        type=float,
        default=8.0,
        help="waiting requests per replica above which to scale up (default: %(default)s)",
    )
    policy.add_argument(
        "--kv-usage-high",
        type=float,
        default=0.9,
        help="decode KV usage that scales up (default: %(default)s)",
    )
    policy.add_argument(
        "--kv-usage-low",
        type=float,
        default=0.5,
        help="KV usage below which a scale-down is allowed (default: %(default)s)",
    )
    policy.add_argument("--scale-up-step", type=int, default=1, help="smallest increase (default: %(default)s)")
    policy.add_argument("--scale-down-step", type=int, default=1, help="decrease per step (default: %(default)s)")
    policy.add_argument("--max-step", type=int, default=4, help="largest change per evaluation (default: %(default)s)")
    policy.add_argument(
        "--scale-up-cooldown-s", type=float, default=60.0, help="between increases (default: %(default)s)"
    )
    policy.add_argument(
        "--scale-down-cooldown-s",
        type=float,
        default=300.0,
        help="calm time (and time since the last change) before a decrease (default: %(default)s)",
    )

    loop = parser.add_argument_group("loop")
    loop.add_argument(
        "--interval-s", type=float, default=30.0, help="seconds between evaluations (default: %(default)s)"
    )
    loop.add_argument(
        "--drain-timeout-s",
        type=float,
        default=600.0,
        help="remove drained workers after this even if they still hold requests (default: %(default)s)",
    )
    loop.add_argument("--once", action="store_true", help="one evaluation, then exit (status 1 if it failed)")
    loop.add_argument("--dry-run", action="store_true", help="log the decisions, patch nothing")
    loop.add_argument("--log-level", default="info", help="debug, info, warning (default: %(default)s)")


def policy_config_from_args(args: argparse.Namespace) -> PolicyConfig:
    from services.planner.policy import GroupLimits, PolicyConfig

    return PolicyConfig(
        ttft_target_s=args.ttft_target_s,
        tpot_target_s=args.tpot_target_s,
        prefill=GroupLimits(args.prefill_min_replicas, args.prefill_max_replicas),
        decode=GroupLimits(args.decode_min_replicas, args.decode_max_replicas),
        scale_up_ratio=args.scale_up_ratio,
        scale_down_ratio=args.scale_down_ratio,
        queue_per_replica=args.queue_per_replica,
        kv_usage_high=args.kv_usage_high,
        kv_usage_low=args.kv_usage_low,
        scale_up_step=args.scale_up_step,
        scale_down_step=args.scale_down_step,
        max_step=args.max_step,
        scale_up_cooldown_s=args.scale_up_cooldown_s,
        scale_down_cooldown_s=args.scale_down_cooldown_s,
    )


def run(args: argparse.Namespace) -> int:
    from services.planner.drain import Downscaler
    from services.planner.kube import RayClusterError, RayClusterScaler, custom_objects_api
    from services.planner.loop import GroupNames, evaluate
    from services.planner.policy import PlannerState
    from services.planner.prometheus import PrometheusError, PrometheusReader, SignalQueries
    from services.planner.ray_workers import RayWorkerDirectory

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = policy_config_from_args(args)
        queries = SignalQueries(model=args.model, selector=args.metrics_selector, window=args.window)
    except ValueError as exc:
        log.error("invalid planner settings: %s", exc)
        return 2
    if args.interval_s <= 0:
        log.error("--interval-s must be > 0, got %s", args.interval_s)
        return 2

    reader = PrometheusReader(args.prometheus_url, queries)
    scaler = RayClusterScaler(custom_objects_api(args.kube_host), args.kube_namespace, args.raycluster)
    groups = GroupNames(args.prefill_group, args.decode_group)
    downscaler = (
        Downscaler(RayWorkerDirectory(args.ray_address, args.ray_namespace, args.deployment), args.drain_timeout_s)
        if args.ray_address
        else None
    )
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info(
        "planner for RayCluster %s/%s every %gs%s: %s",
        args.kube_namespace,
        args.raycluster,
        args.interval_s,
        " (dry run)" if args.dry_run else "",
        config,
    )
    state = PlannerState()
    try:
        while True:
            try:
                _, state = evaluate(
                    config,
                    reader,
                    scaler,
                    groups,
                    state,
                    time.monotonic(),
                    downscaler=downscaler,
                    dry_run=args.dry_run,
                )
                failed = False
            except (PrometheusError, RayClusterError) as exc:
                log.warning("holding: %s", exc)
                failed = True
            if args.once:
                return 1 if failed else 0
            if stop.wait(args.interval_s):
                log.info("stopping on SIGTERM")
                return 0
    finally:
        reader.close()


COMMAND = Command(
    "planner",
    "resize the prefill and decode worker groups from TTFT/TPOT in Prometheus",
    add_arguments,
    run,
    order=6,
    description=__doc__,
)
