"""The app's exception handlers: every failure leaves in the OpenAI error shape (errors.py),
including Starlette's own 404/405 and validation errors and anything unexpected (a 500,
logged with its traceback)."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from services.gateway.errors import (
    APIError,
    ClientClosedRequest,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
)

logger = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        if exc.status >= 500 or isinstance(exc, ClientClosedRequest):
            level = logging.INFO if isinstance(exc, ClientClosedRequest) else logging.WARNING
            logger.log(level, "%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return InvalidRequest(f"invalid request: {exc.errors()[:1]}", code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return NotFound(f"Unknown endpoint: {request.method} {request.url.path}", code="not_found").response()
        if exc.status_code == 405:
            error = MethodNotAllowed(
                f"Method {request.method} is not allowed for {request.url.path}", code="method_not_allowed"
            )
            return error.response()
        status = exc.status_code
        error_type = "invalid_request_error" if status < 500 else "server_error"
        return JSONResponse(
            {"error": {"message": str(exc.detail), "type": error_type, "param": None, "code": None}},
            status_code=status,
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return InternalError("The server had an error while processing your request.").response()
