"""The gateway's admission options (docs/design.md §6.8): per-request limits, the threads that
prepare request bodies, per-key rate limits, limits shared by gateways, HTTP timeouts."""

from __future__ import annotations

import argparse
from typing import Any


def add_admission_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--max-choices-per-request",
        type=int,
        default=128,
        help="prompts x n in one request (400 above, counted before anything is tokenised; default: %(default)s)",
    )
    group.add_argument(
        "--max-tokens-per-request",
        type=int,
        default=None,
        help="prompt tokens plus max_tokens (the rest of the context when unset), summed over a request's "
        "choices (400 above; default: 16 x the model's context length)",
    )
    group.add_argument(
        "--tokenizer-threads",
        type=int,
        default=2,
        help="threads decoding, validating and tokenising request bodies off the event loop; more bodies "
        "wait their turn (default: %(default)s)",
    )
    group.add_argument(
        "--rate-limit-rpm",
        type=int,
        default=0,
        help="requests per minute per API key, or per client address without --api-keys (429; 0: off)",
    )
    group.add_argument(
        "--rate-limit-tpm",
        type=int,
        default=0,
        help="prompt + completion tokens per minute per API key, or per client address (429; 0: off)",
    )
    group.add_argument(
        "--shared-admission",
        action="store_true",
        help="the per-worker caps count every gateway's requests (the worker's reported queue), not only "
        "this gateway's: for deployments with several gateways",
    )
    group.add_argument(
        "--header-timeout",
        type=float,
        default=30.0,
        help="seconds a connection has to send its request headers (closed after; default: %(default)s)",
    )
    group.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        help="seconds a request has to send its whole body (408 after; default: %(default)s)",
    )


def admission_config_from_args(args: argparse.Namespace) -> Any:
    from services.gateway.config import AdmissionConfig

    return AdmissionConfig(
        max_choices_per_request=args.max_choices_per_request,
        max_tokens_per_request=args.max_tokens_per_request,
        tokenizer_threads=args.tokenizer_threads,
        rate_limit_rpm=args.rate_limit_rpm,
        rate_limit_tpm=args.rate_limit_tpm,
        body_timeout_s=args.body_timeout,
    )
