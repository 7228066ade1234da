"""The gateway's OpenAPI document (`GET /openapi.json`) with the request bodies the routes take.

The routes read raw bodies (body.py) and validate them with their own pydantic models, so
FastAPI sees no body to describe; this module adds each POST route's models to the document
(`components.schemas`, referenced from the route's `requestBody`), so that clients and
schema-driven tests see the real fields. Error responses are described once, in the OpenAI
shape every refusal takes (errors.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from services.gateway.protocol import ChatCompletionRequest, CompletionRequest
from services.gateway.responses_api.protocol import ResponsesRequest
from services.gateway.utility_protocol import DetokenizeRequest, TokenizeChatRequest, TokenizePromptRequest

# POST path -> the bodies it takes (one of them)
REQUEST_BODIES: dict[str, tuple[type[BaseModel], ...]] = {
    "/v1/chat/completions": (ChatCompletionRequest,),
    "/v1/completions": (CompletionRequest,),
    "/v1/responses": (ResponsesRequest,),
    "/tokenize": (TokenizePromptRequest, TokenizeChatRequest),
    "/detokenize": (DetokenizeRequest,),
}
_REF = "#/components/schemas/{model}"
_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def install_openapi(app: FastAPI, version: str) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, version)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, version: str) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=version, routes=app.routes)
    models = sorted({m for bodies in REQUEST_BODIES.values() for m in bodies}, key=lambda m: m.__name__)
    refs, definitions = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(definitions.get("$defs", {}))
    schemas["Error"] = _ERROR_SCHEMA
    for path, bodies in REQUEST_BODIES.items():
        variants = [refs[(m, "validation")] for m in bodies]
        body_schema = variants[0] if len(variants) == 1 else {"oneOf": variants}
        operation = document["paths"][path]["post"]
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_schema}}}
    for methods in document["paths"].values():
        for operation in methods.values():
            operation["responses"].pop("422", None)  # FastAPI's own validation errors are 400s here
            operation["responses"]["default"] = {
                "description": "An error in OpenAI's shape",
                "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}},
            }
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document
