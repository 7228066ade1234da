"""Options for what happens to requests when workers die or the service stops
(docs/design.md §5.6, §6.9, §6.10)."""

from __future__ import annotations

import argparse


def add_reliability_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reliability")
    group.add_argument(
        "--migration-limit",
        type=int,
        default=3,
        help="times a request may move to another worker when its own dies or drains; 0: never (default: %(default)s)",
    )
    group.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="seconds that running requests get to finish after SIGTERM before they move to another "
        "worker or end with an error event (default: %(default)s)",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=0.0,
        help="seconds a request may take from arrival to its last byte; past it, a 504 (or an error "
        "event) and its work is dropped; 0: no limit (default: %(default)s)",
    )
    group.add_argument(
        "--queue-timeout",
        type=float,
        default=0.0,
        help="seconds a request may wait for its first token; 0: no limit (default: %(default)s)",
    )
    group.add_argument(
        "--keepalive-interval",
        type=float,
        default=15.0,
        help="seconds of silence after which a stream sends an SSE comment (default: %(default)s)",
    )
