"""Options for what happens to requests when workers die or the service stops
(docs/design.md §5.6)."""

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
