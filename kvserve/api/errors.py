"""Errors in each protocol's own shape.

OpenAI: `{"error": {"message", "type", "param", "code"}}`.
Anthropic: `{"type": "error", "error": {"type", "message"}}`.
The shape follows the route: everything under /v1/messages is Anthropic, the rest OpenAI.
Client mistakes are always 4xx; validation errors are 400 (never FastAPI's 422).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvserve.chat.tools import ToolSchemaError
from kvserve.serving.errors import ContextLengthExceededError, RequestError

logger = logging.getLogger(__name__)

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """An HTTP error answered in the route's protocol shape. `extra` adds fields next to message."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.extra = extra or {}

    @classmethod
    def from_request_error(cls, error: RequestError) -> ApiError:
        extra = {}
        if isinstance(error, ContextLengthExceededError):
            extra = {"n_prompt_tokens": error.n_prompt_tokens, "n_ctx": error.n_ctx}
        return cls(error.status, error.message, param=error.param, code=error.code, extra=extra)


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def openai_error_body(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    error_type = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code, **(extra or {})}}


def anthropic_error_body(status: int, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    error_type = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": error_type, "message": message, **(extra or {})}}


def anthropic_message(error: ApiError) -> str:
    """The Messages API's own wording where it has one. A context overflow reads as Anthropic's
    "prompt is too long: N tokens > M maximum": Claude Code recognizes an overflow by that phrase
    and reads N and M from it to compact the conversation and retry (with the OpenAI wording it
    showed an API error and stopped). M is the longest prompt the server takes: a prompt must leave
    room for one token of output, so it is the context size less one."""
    if error.code == "context_length_exceeded" and {"n_prompt_tokens", "n_ctx"} <= error.extra.keys():
        return f"prompt is too long: {error.extra['n_prompt_tokens']} tokens > {error.extra['n_ctx'] - 1} maximum"
    return error.message


def error_response(path: str, error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    if is_anthropic_path(path):
        body = anthropic_error_body(error.status, anthropic_message(error), error.extra)
    else:
        body = openai_error_body(error.status, error.message, error.param, error.code, error.extra)
    return JSONResponse(body, status_code=error.status, headers=headers)


def validation_message(error: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """First problem as `field: message`, plus the dotted field path for `param`."""
    errors = error.errors()
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # A union reports one error per member, with the member's type appended to the path
    # (`prompt.str`, `prompt.list[str]`); the path they share is the field the client got wrong.
    for other in errors[1:]:
        other_loc = [str(p) for p in other.get("loc", ()) if p != "body"]
        if other_loc[:1] == loc[:1]:
            shared = 0
            while shared < min(len(loc), len(other_loc)) and loc[shared] == other_loc[shared]:
                shared += 1
            loc = loc[:shared]
    param = ".".join(loc) or None
    return (
        f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
    ), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(request.url.path, error)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, error: RequestError) -> JSONResponse:
        return error_response(request.url.path, ApiError.from_request_error(error))

    @app.exception_handler(ToolSchemaError)
    async def _tool_schema_error(request: Request, error: ToolSchemaError) -> JSONResponse:
        return error_response(request.url.path, ApiError(400, str(error), param=error.param))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = validation_message(error)
        return error_response(request.url.path, ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        messages = {
            404: f"unknown endpoint: {request.method} {request.url.path}",
            405: f"method {request.method} not allowed on {request.url.path}",
        }
        message = messages.get(error.status_code, str(error.detail))
        headers = dict(error.headers or {})
        return error_response(request.url.path, ApiError(error.status_code, message), headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, ApiError(500, "internal server error"))
