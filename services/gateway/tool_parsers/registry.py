"""Choosing the tool parser of a model: by name, or from the markers its chat template writes."""

from __future__ import annotations

from services.gateway.tool_parsers.hermes import OPEN_TAG, HermesToolParser
from services.gateway.tool_parsers.llama3_json import PYTHON_TAG, Llama3JsonToolParser
from services.gateway.tool_parsers.mistral import TOOL_CALLS, MistralToolParser
from services.gateway.tool_parsers.parser import ToolParser

PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser for parser in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)
}


def parser_for(name: str | None, chat_template: str | None) -> type[ToolParser] | None:
    """The parser class named `name`; without a name, the one the chat template's markers point
    to; None when neither says. An unknown name is a ValueError listing the known ones."""
    if name is not None:
        if name not in PARSERS:
            raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(PARSERS))}")
        return PARSERS[name]
    if not chat_template:
        return None
    if OPEN_TAG in chat_template:
        return HermesToolParser
    if TOOL_CALLS in chat_template:
        return MistralToolParser
    if PYTHON_TAG in chat_template or _writes_llama3_json_calls(chat_template):
        return Llama3JsonToolParser
    return None


def _writes_llama3_json_calls(chat_template: str) -> bool:
    """Llama 3.2/3.3 templates without the python tag: Llama 3 headers and `"parameters"` calls."""
    return "<|start_header_id|>" in chat_template and '"parameters"' in chat_template
