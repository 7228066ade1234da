"""Structured output: grammars a request's tokens must follow (docs/design.md §2.8)."""

from engine.structured.spec import GrammarKind, GrammarSpec

__all__ = ["GrammarKind", "GrammarSpec"]
