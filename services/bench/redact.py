"""Credentials stay out of what a bench run prints and writes.

The secrets of a run are its API key (from --api-key or DSPARK_BENCH_API_KEY) and a password
written into --url (`http://user:PASSWORD@host`). Every string that reaches an output file or
the console (the recorded command line, the URL, the label, error messages a server sent
back) passes through `Redactor.text`, which replaces each secret wherever it occurs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

REDACTED = "<redacted>"


@dataclass(frozen=True)
class Redactor:
    secrets: tuple[str, ...]

    @staticmethod
    def for_run(api_key: str | None, url: str) -> Redactor:
        candidates = (api_key, urlsplit(url).password)
        return Redactor(tuple(secret for secret in candidates if secret))

    def text(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def value(self, value: Any) -> Any:
        """`text` applied to every string inside dicts, lists and tuples (keys included)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.value(v) for v in value)
        return value
