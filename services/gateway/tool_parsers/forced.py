"""Forced tool calls as a grammar: for `tool_choice: "required"` or a named function, the
output is constrained to one or more calls written in the model family's own syntax, each
call's arguments to its function's parameter schema (docs/design.md §6.6). The result is an
xgrammar structural tag (JSON), which the engine compiles; the family's parser then reads the
output like any other.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ANY_OBJECT: dict[str, Any] = {"type": "object"}
# Whitespace between JSON tokens inside a call's arguments; unbounded, a small model sampled
# at temperature 1 can write newlines until max_tokens.
MAX_WHITESPACE = 2


@dataclass(frozen=True)
class _Syntax:
    call_begin: str  # before the name; the name is a JSON string, then `name_end`
    name_end: str  # between the name and the arguments object
    call_end: str
    separator: str  # between calls
    before: str = ""  # before the first call
    after: str = ""  # after the last call


_SYNTAX: dict[str, _Syntax] = {
    "hermes": _Syntax('<tool_call>\n{"name": ', ', "arguments": ', "}\n</tool_call>", "\n"),
    "llama3_json": _Syntax('{"name": ', ', "parameters": ', "}", "; "),
    "mistral": _Syntax('{"name": ', ', "arguments": ', "}", ", ", before="[TOOL_CALLS][", after="]"),
}


def forced_calls_tag(parser_name: str, functions: Sequence[tuple[str, dict[str, Any] | None]], single: bool) -> Any:
    """The structural tag for at least one call (exactly one if `single`) of the `functions`
    (name, parameter schema or None for any object) in the syntax of `parser_name`."""
    syntax = _SYNTAX[parser_name]
    tags = [
        {
            "type": "tag",
            "begin": syntax.call_begin + json.dumps(name) + syntax.name_end,
            "content": {
                "type": "json_schema",
                "json_schema": schema if schema is not None else ANY_OBJECT,
                "max_whitespace_cnt": MAX_WHITESPACE,
            },
            "end": syntax.call_end,
        }
        for name, schema in functions
    ]
    calls: dict[str, Any] = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": syntax.separator,
        "at_least_one": True,
        "stop_after_first": single,
    }
    elements = []
    if syntax.before:
        elements.append({"type": "const_string", "value": syntax.before})
    elements.append(calls)
    if syntax.after:
        elements.append({"type": "const_string", "value": syntax.after})
    body = calls if len(elements) == 1 else {"type": "sequence", "elements": elements}
    return {"type": "structural_tag", "format": body}
