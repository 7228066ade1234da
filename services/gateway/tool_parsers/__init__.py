"""Tool calls in generated text, the OpenAI way (issue #18): a parser per model family
(`hermes`, `llama3_json`, `mistral`) behind one interface, for whole outputs and for streams.

    parser_class = parser_for(name, chat_template)    # or None: the model has no tool syntax
    parsed = parser_class().parse(text)               # ParsedOutput(content, tool_calls)
    stream = parser_class().stream()                  # per choice: feed(piece), finish() -> deltas

Pure text in, typed results out: nothing here knows the engine or HTTP.
"""

from services.gateway.tool_parsers.hermes import HermesToolParser
from services.gateway.tool_parsers.llama3_json import Llama3JsonToolParser
from services.gateway.tool_parsers.mistral import MistralToolParser
from services.gateway.tool_parsers.output import (
    ContentDelta,
    Delta,
    IdFactory,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    new_call_id,
    tool_finish_reason,
)
from services.gateway.tool_parsers.parser import ToolParser
from services.gateway.tool_parsers.registry import PARSERS, parser_for
from services.gateway.tool_parsers.stream import ToolCallStream

__all__ = [
    "PARSERS",
    "ContentDelta",
    "Delta",
    "HermesToolParser",
    "IdFactory",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedOutput",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "new_call_id",
    "parser_for",
    "tool_finish_reason",
]
