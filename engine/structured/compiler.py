"""Grammar compilation with xgrammar (docs/design.md §2.8): one compiler per tokenizer, compiled
grammars cached by spec, so a tool set or schema that many requests share compiles once."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from engine.structured.spec import GrammarSpec

if TYPE_CHECKING:  # imported on first use: engines that serve no grammar never load it
    import xgrammar as xgr


class GrammarError(ValueError):
    """The grammar cannot be compiled; the message says why (a client error)."""


class GrammarCompiler:
    """Compiles `GrammarSpec`s for one tokenizer. Thread-safe: the gateway compiles in worker
    threads to validate requests, the engine when a request arrives."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        import xgrammar as xgr

        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(
            hf_tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(set(stop_token_ids))
        )
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        self._lock = threading.Lock()
        self._cache: dict[GrammarSpec, xgr.CompiledGrammar] = {}

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        with self._lock:
            compiled = self._cache.get(spec)
        if compiled is not None:
            return compiled
        try:
            compiled = self._compiler.compile_grammar(_grammar(spec))
        except GrammarError:
            raise
        except Exception as exc:  # xgrammar's compile errors have no common base
            raise GrammarError(_first_line(exc)) from None
        with self._lock:
            if len(self._cache) >= 512:
                self._cache.pop(next(iter(self._cache)))
            self._cache[spec] = compiled
        return compiled


def _grammar(spec: GrammarSpec) -> xgr.Grammar:
    import xgrammar as xgr

    try:
        if spec.kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "json_schema":
            return xgr.Grammar.from_json_schema(spec.source, any_whitespace=False, strict_mode=True)
        if spec.kind == "regex":
            re.compile(spec.source)  # Python's verdict first: its messages are clearer
            return xgr.Grammar.from_regex(spec.source)
        if spec.kind == "choice":
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_quoted(c) for c in json.loads(spec.source)))
        if spec.kind == "structural_tag":
            return xgr.Grammar.from_structural_tag(spec.source)
        return xgr.Grammar.from_ebnf(spec.source)
    except re.error as exc:
        raise GrammarError(f"invalid regular expression: {exc}") from None
    except Exception as exc:  # xgrammar raises RuntimeError, ValueError and its own errors
        raise GrammarError(_first_line(exc)) from None


@lru_cache(maxsize=1024)
def _quoted(text: str) -> str:
    """An EBNF string literal: JSON string escapes are xgrammar's."""
    return json.dumps(text, ensure_ascii=False)


_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # "[07:23:50] /path/file.cc:4944: "


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _LOG_PREFIX.sub("", text.splitlines()[0])[:500]
