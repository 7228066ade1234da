"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the gateway answers goes through `APIError`, so status, type and code are
chosen in one place.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    status: int = 500
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    def __init__(self, max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> None:
        requested = prompt_tokens + (max_tokens or 0)
        detail = (
            f"you requested {requested} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion)"
            if max_tokens is not None
            else f"the prompt has {prompt_tokens} tokens"
        )
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, {detail}. "
            "Please reduce the length of the prompt or completion.",
            param="messages",
            code="context_length_exceeded",
        )


class AuthenticationFailed(APIError):
    status = 401
    type = "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class ModelNotFound(APIError):
    status = 404
    type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"


class RequestTooLarge(APIError):
    status = 413
    type = "invalid_request_error"

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"Request body is larger than the limit of {limit_bytes} bytes.", code="request_too_large")


class RequestTimeout(APIError):
    status = 408
    type = "invalid_request_error"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"The request body did not arrive within {timeout_s:g} s.",
            code="request_timeout",
            headers={"Connection": "close"},  # the rest of the body is not read
        )


class ClientClosedRequest(APIError):
    """The client closed the connection before its response was ready (nginx's 499)."""

    status = 499
    type = "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="client_closed_request")


class RateLimited(APIError):
    """A key (or client address) spent its requests or tokens per minute; `type` says which,
    as OpenAI's own 429 does."""

    status = 429

    def __init__(self, kind: str, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="rate_limit_exceeded", headers={"Retry-After": str(retry_after_s)})
        self.type = kind


class Overloaded(APIError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="server_overloaded", headers={"Retry-After": str(retry_after_s)})


class ServiceUnavailable(APIError):
    status = 503
    type = "server_error"

    def __init__(self, message: str, code: str = "no_workers") -> None:
        super().__init__(message, code=code, headers={"Retry-After": "1"})


class InternalError(APIError):
    status = 500
    type = "server_error"

    def __init__(self, message: str, code: str | None = "internal_error") -> None:
        super().__init__(message, code=code)


def field_error(message: str) -> InvalidRequest:
    """The engine's "field: message" (SamplingParams, add_request) as a 400 naming the field."""
    field, sep, _ = message.partition(":")
    field = field.strip()
    param = field if sep and field and " " not in field else None
    return InvalidRequest(message, param=param, code="invalid_value")


class RequestTimedOut(APIError):
    """A request past --request-timeout, or still without its first token at --queue-timeout."""

    status = 504
    type = "timeout"

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code=code)
