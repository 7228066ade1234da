"""Which grammar a request's output must follow (docs/design.md §6.6), from OpenAI's
`response_format`, vLLM's `guided_*` fields, or a forced `tool_choice`; each field's problems
are a 400 naming it. Compiling (in `GrammarCheck`) is the final check: a schema or regex the
grammar engine cannot compile is refused here, before any worker sees the request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema

from engine.structured import GrammarSpec
from engine.structured.compiler import GrammarCompiler, GrammarError
from engine.structured.matcher import RequestGrammar
from services.gateway.errors import InvalidRequest
from services.gateway.protocol import ChatCompletionRequest, _SamplingFields
from services.gateway.tool_parsers import ToolParser
from services.gateway.tool_parsers.forced import forced_calls_tag

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def chat_grammar(req: ChatCompletionRequest, tool_parser: type[ToolParser] | None) -> tuple[GrammarSpec | None, str]:
    """The grammar of a chat request and the field it came from ("" for none)."""
    forced = _forced_tool_calls(req, tool_parser)
    named = [name for name in _GUIDED if getattr(req, name) is not None]
    response_format = req.response_format if req.response_format and req.response_format.type != "text" else None
    sources = ([("tool_choice", forced)] if forced else []) + [(name, None) for name in named]
    if response_format is not None:
        sources.append(("response_format", None))
    if len(sources) > 1:
        first, second = sources[0][0], sources[1][0]
        raise InvalidRequest(
            f"{second}: cannot be combined with {first}; a request follows at most one grammar",
            param=second,
            code="invalid_value",
        )
    if forced is not None:
        return forced, "tool_choice"
    if response_format is not None:
        if response_format.type == "json_object":
            return GrammarSpec("json_object"), "response_format"
        json_schema = response_format.json_schema
        if json_schema is None:
            raise InvalidRequest(
                "response_format.json_schema: required when type is json_schema",
                param="response_format.json_schema",
                code="missing_required_parameter",
            )
        schema = json_schema.schema_ if json_schema.schema_ is not None else {"type": "object"}
        _check_schema(schema, "response_format.json_schema.schema")
        return GrammarSpec.json_schema(schema), "response_format"
    return guided_grammar(req)


def guided_grammar(req: _SamplingFields) -> tuple[GrammarSpec | None, str]:
    named = [name for name in _GUIDED if getattr(req, name) is not None]
    if len(named) > 1:
        raise InvalidRequest(f"{named[1]}: cannot be combined with {named[0]}", param=named[1], code="invalid_value")
    if not named:
        return None, ""
    field = named[0]
    value = getattr(req, field)
    if field == "guided_json":
        schema = _json_value(value, field)
        _check_schema(schema, field)
        return GrammarSpec.json_schema(schema), field
    if field == "guided_choice":
        return GrammarSpec.choice(list(value)), field
    if not value:
        raise InvalidRequest(f"{field}: must not be empty", param=field, code="invalid_value")
    return GrammarSpec("regex" if field == "guided_regex" else "ebnf", value), field


def _forced_tool_calls(req: ChatCompletionRequest, tool_parser: type[ToolParser] | None) -> GrammarSpec | None:
    choice = req.tool_choice
    if choice in (None, "none", "auto") or not req.tools:
        return None
    if tool_parser is None:
        raise InvalidRequest(
            "tool_choice: this model's chat template writes no tool-call syntax the server knows; "
            "start it with --tool-call-parser",
            param="tool_choice",
            code="unsupported_parameter",
        )
    tools = [t.function for t in req.tools]
    if not isinstance(choice, str):
        tools = [f for f in tools if f.name == choice.function.name]
    single = not isinstance(choice, str) or req.parallel_tool_calls is False
    tag = forced_calls_tag(tool_parser.name, [(f.name, f.parameters) for f in tools], single)
    return GrammarSpec.structural_tag(tag)


def _json_value(value: dict[str, Any] | str, field: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: not valid JSON: {exc}", param=field, code="invalid_value") from None


def _check_schema(schema: Any, param: str) -> None:
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}: a JSON Schema must be an object", param=param, code="invalid_value")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(
            f"{param}: not a valid JSON Schema: {exc.message}", param=param, code="invalid_value"
        ) from None


class DeadGrammar(Exception):
    """A grammar no token can start."""


class GrammarCheck:
    """Compiles grammars at the gateway, off the event loop, so that one the engine cannot
    compile is a 400 naming its field. Compiled grammars are cached by spec."""

    def __init__(self) -> None:
        self._compiler: GrammarCompiler | None = None
        self._tokenizer: Any = None

    async def check(self, spec: GrammarSpec, param: str, tokenizer: Any, vocab_size: int) -> None:
        try:
            await asyncio.to_thread(self._compile, spec, tokenizer, vocab_size)
        except GrammarError as exc:
            raise InvalidRequest(
                f"{param}: the grammar engine cannot use this: {exc}", param=param, code="invalid_value"
            ) from None
        except DeadGrammar:
            raise InvalidRequest(
                f"{param}: no output can match it: it needs text that no token of the model's vocabulary can spell",
                param=param,
                code="invalid_value",
            ) from None

    def _compile(self, spec: GrammarSpec, tokenizer: Any, vocab_size: int) -> None:
        compiled = self._compiler_for(tokenizer, vocab_size).compile(spec)
        if not RequestGrammar(compiled).has_next_token(vocab_size):
            raise DeadGrammar

    def _compiler_for(self, tokenizer: Any, vocab_size: int) -> GrammarCompiler:
        if self._compiler is None or self._tokenizer is not tokenizer:
            hf_tokenizer = getattr(tokenizer, "hf_tokenizer", None)
            if hf_tokenizer is None:
                raise InvalidRequest(
                    "structured output needs the model's Hugging Face tokenizer", code="unsupported_parameter"
                )
            self._compiler = GrammarCompiler(hf_tokenizer, vocab_size, getattr(tokenizer, "eos_token_ids", ()))
            self._tokenizer = tokenizer
        return self._compiler
