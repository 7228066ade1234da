"""`POST /tokenize`, `POST /detokenize` and `GET /version`, answered as vLLM's OpenAI server
answers them.

The tokenizer routes take the generation routes' checks in the same order (key, body size
and JSON, fields, 503 until a worker is ready, model) and count their refusals the same way.
They decode and tokenise in the gateway's preparation threads (preparation.py): a body near
the size limit takes seconds to encode, and the event loop keeps serving open streams
meanwhile. A conversation is rendered by the chat
endpoint's own function, so its tokens are the ones a chat completion is served with.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.requests import Request

from services.gateway.errors import InvalidRequest
from services.gateway.preprocess import chat_prompt, tokenizer_vocab_size
from services.gateway.protocol import ChatCompletionRequest
from services.gateway.utility_protocol import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeRequest,
    parse_detokenize,
    parse_tokenize,
)

if TYPE_CHECKING:
    from services.gateway.app import Admission, Gateway

PACKAGE = "dspark-serve"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

Body = TypeVar("Body", DetokenizeRequest, TokenizeRequest)


def install_utility_routes(app: FastAPI, gateway: Gateway) -> None:
    version = package_version()

    async def admit(
        request: Request, admission: Admission, parse: Callable[[dict[str, Any]], Body]
    ) -> tuple[Body, int, Any]:
        """(parsed body, max_model_len, tokenizer) of the model the body names, or of the
        served model when it names none."""
        gateway.admit(request)
        body = await gateway.read_json(request)
        requested = body.get("model")
        admission.requested_model = requested if isinstance(requested, str) else None
        req = await gateway.parse(parse, body)
        model, max_model_len, tokenizer = gateway.model_info()
        if req.model is None:
            admission.requested_model = model
        else:
            gateway.check_model(req.model, model)
        return req, max_model_len, tokenizer

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        with gateway.counting_refusals() as admission:
            req, max_model_len, tokenizer = await admit(request, admission, parse_tokenize)
            return await gateway.preparation.run(tokenize_response, req, tokenizer, max_model_len)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        with gateway.counting_refusals() as admission:
            req, _, tokenizer = await admit(request, admission, parse_detokenize)
            return await gateway.preparation.run(detokenize_response, req, tokenizer)

    @app.get("/version")
    async def show_version() -> JSONResponse:
        return JSONResponse({"version": version})


# The responses are built in the preparation thread too: a JSONResponse serialises its body when
# constructed, and the ids of a body near the size limit take a second to write out.


def tokenize_response(req: TokenizeRequest, tokenizer: Any, max_model_len: int) -> JSONResponse:
    if isinstance(req, TokenizeChatRequest):
        # chat_prompt reads only the messages and tools, which the tokenize body has validated
        chat = ChatCompletionRequest.model_construct(model=req.model or "", messages=req.messages, tools=req.tools)
        tokens = chat_prompt(
            chat,
            tokenizer,
            add_generation_prompt=req.add_generation_prompt,
            add_special_tokens=req.add_special_tokens,
        )
    else:
        tokens = list(tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens))
    token_strs = list(tokenizer.convert_ids_to_tokens(tokens)) if req.return_token_strs else None
    return JSONResponse(
        {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}
    )


def detokenize_response(req: DetokenizeRequest, tokenizer: Any) -> JSONResponse:
    """The text of the token ids, special tokens kept (so a rendered conversation round-trips)."""
    vocab_size = tokenizer_vocab_size(tokenizer)
    for i, token in enumerate(req.tokens):
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise InvalidRequest(
                f"tokens[{i}]: token id {token} is out of range [0, {vocab_size})",
                param="tokens",
                code="invalid_value",
            )
    return JSONResponse({"prompt": tokenizer.decode(req.tokens, skip_special_tokens=False)})


def package_version() -> str:
    """The installed distribution's version; from a source tree, pyproject.toml's."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pass
    import tomllib  # only a source tree without installed metadata reads TOML

    try:
        with PYPROJECT.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
