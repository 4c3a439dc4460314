"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server reports goes through here, so clients written against
OpenAI's or vLLM's API see the same shape and status codes.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm_volta.engine.engine_errors import EngineDeadError, ServerShuttingDown
from vllm_volta.logger import init_logger

logger = init_logger(__name__)

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    """An error to return to the client with the given HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an OpenAI error response."""
    err_type = _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def _validation_param(loc: tuple) -> str | None:
    # loc looks like ("body", "messages", 0, "content"); the client knows the body.
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"Invalid JSON body: {first.get('msg', '')}", None
    param = _validation_param(tuple(first.get("loc", ())))
    msgs = []
    for err in errors[:5]:
        where = _validation_param(tuple(err.get("loc", ())))
        msgs.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(msgs), param


def install_error_handlers(app: FastAPI) -> None:
    """Route FastAPI/pydantic/HTTP errors and our own into the OpenAI shape."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(message, 400, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return error_response(message, exc.status_code)

    @app.exception_handler(EngineDeadError)
    @app.exception_handler(ServerShuttingDown)
    async def _unavailable(_: Request, exc: Exception) -> JSONResponse:
        # Not the request's fault: a supervisor restarts the server, the client retries.
        return error_response(f"Service unavailable: {exc}", 503)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: log it with the traceback, answer 500, keep serving.
        logger.exception("unhandled error while serving a request")
        return error_response(f"Internal server error: {type(exc).__name__}", 500)
