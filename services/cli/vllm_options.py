"""Options spelled as `vllm serve` spells them, and how they map onto dspark-serve's own.

The positional MODEL is `--model`; `--api-key` adds to `--api-keys`; `--speculative-config
'{"method": "dspark", "model": DRAFTER, "num_speculative_tokens": GAMMA}'` is `--speculative on
--drafter DRAFTER --gamma GAMMA`. Conflicting spellings are usage errors naming both.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MODEL_GIVEN = "_model_given"  # namespace attribute: (model, where it was given) of the command line
SPECULATIVE_METHOD = "dspark"
_SPECULATIVE_KEYS = ("method", "model", "num_speculative_tokens")


class ModelAction(argparse.Action):
    """`--model X` and the positional MODEL (`dspark-serve up MODEL`) name one model: giving
    both with different values is an error (`--model` repeated keeps the last, as argparse does)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        where = option_string or "MODEL"
        earlier = getattr(namespace, _MODEL_GIVEN, None)
        if earlier is not None and earlier[1] != where and earlier[0] != values:
            raise argparse.ArgumentError(
                self, f"{values!r} conflicts with {earlier[1]} {earlier[0]!r}; give the model once"
            )
        setattr(namespace, _MODEL_GIVEN, (values, where))
        setattr(namespace, self.dest, values)


class AppendOnCommandLine(argparse._AppendAction):
    """Repeatable `--opt X`: values given on the command line replace the default (which the
    environment may have set) instead of adding to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is self.default else list(current or [])
        items.append(values)
        setattr(namespace, self.dest, items)


def memory_fraction(text: str) -> float:
    """A fraction of device memory, in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in (0, 1]")
    return value


def chat_template_text(text: str) -> str:
    """The template a Jinja file holds, or `text` itself when it is an inline template."""
    path = Path(text).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    if "{{" in text or "{%" in text:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a file nor an inline Jinja template (it holds no '{{{{' or '{{%')"
    )


@dataclass(frozen=True)
class SpeculativeSpec:
    """`--speculative-config` as parsed: the drafter checkpoint (vLLM's `model`) and the draft
    block size (vLLM's `num_speculative_tokens`), None where the JSON leaves them out."""

    drafter: str | None = None
    gamma: int | None = None


def speculative_config(text: str) -> SpeculativeSpec:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise argparse.ArgumentTypeError(
            'expected a JSON object such as {"method": "dspark", "num_speculative_tokens": 8}'
        )
    unknown = sorted(set(raw) - set(_SPECULATIVE_KEYS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; dspark-serve reads {', '.join(_SPECULATIVE_KEYS)}"
        )
    method = raw.get("method", SPECULATIVE_METHOD)
    if method != SPECULATIVE_METHOD:
        raise argparse.ArgumentTypeError(
            f"method {method!r} is not supported: dspark-serve drafts with DSpark only (method {SPECULATIVE_METHOD!r})"
        )
    drafter = raw.get("model")
    if drafter is not None and not (isinstance(drafter, str) and drafter):
        raise argparse.ArgumentTypeError(f"model must be the drafter's checkpoint directory, got {drafter!r}")
    gamma = raw.get("num_speculative_tokens")
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1):
        raise argparse.ArgumentTypeError(f"num_speculative_tokens must be a positive integer, got {gamma!r}")
    return SpeculativeSpec(drafter, gamma)


@dataclass(frozen=True)
class SpeculativeChoice:
    """What `--speculative`, `--drafter`, `--gamma` and `--speculative-config` settle together."""

    mode: str  # auto, on, off
    drafter: str | None
    gamma: int | None


def resolve_speculative(
    mode: str, drafter: str | None, gamma: int | None, spec: SpeculativeSpec | None
) -> SpeculativeChoice:
    """`--speculative-config` turns DSpark on with its drafter and gamma; ValueError where it
    contradicts the options of dspark-serve's own spelling."""
    if spec is None:
        return SpeculativeChoice(mode, drafter, gamma)
    if mode == "off":
        raise ValueError("--speculative-config turns DSpark on; it conflicts with --speculative off")
    if drafter is not None and spec.drafter is not None and drafter != spec.drafter:
        raise ValueError(f"--speculative-config model {spec.drafter!r} conflicts with --drafter {drafter!r}")
    if gamma is not None and spec.gamma is not None and gamma != spec.gamma:
        raise ValueError(f"--speculative-config num_speculative_tokens {spec.gamma} conflicts with --gamma {gamma}")
    return SpeculativeChoice(
        "on", spec.drafter if spec.drafter is not None else drafter, spec.gamma if spec.gamma is not None else gamma
    )
