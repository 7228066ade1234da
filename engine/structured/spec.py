"""What a request's output must match: a grammar, stated independently of the engine that
enforces it, so that it can cross process boundaries with the sampling parameters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_object", "json_schema", "regex", "choice", "ebnf", "structural_tag"]
_KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "choice", "ebnf", "structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    """`kind` and its `source`:

    - `json_object`: any JSON object (`source` is empty);
    - `json_schema`: JSON text of a JSON Schema;
    - `regex`: a regular expression the whole output must match;
    - `choice`: JSON text of a list of strings, the output being exactly one of them;
    - `ebnf`: a grammar in xgrammar's EBNF dialect, rule `root` first;
    - `structural_tag`: JSON text of an xgrammar structural tag (`{"type": "structural_tag",
      "format": ...}`): tagged regions such as tool calls, each with its own JSON Schema.

    After the whole grammar the only token allowed is a stop token (EOS or the chat
    template's end of turn).
    """

    kind: GrammarKind
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"grammar: kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.kind != "json_object" and not self.source:
            raise ValueError(f"grammar: a {self.kind} grammar needs a source")
        if self.kind == "choice":
            choices = json.loads(self.source)
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) and c for c in choices)):
                raise ValueError("grammar: choice needs a non-empty list of non-empty strings")

    @classmethod
    def json_schema(cls, schema: object) -> GrammarSpec:
        return cls("json_schema", json.dumps(schema))  # key order is the output order

    @classmethod
    def structural_tag(cls, tag: object) -> GrammarSpec:
        return cls("structural_tag", json.dumps(tag))

    @classmethod
    def choice(cls, choices: list[str]) -> GrammarSpec:
        return cls("choice", json.dumps(choices))
