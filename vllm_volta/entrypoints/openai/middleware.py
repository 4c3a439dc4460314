"""ASGI middleware of the server: the API key and the request-body limit.

Pure ASGI rather than ``@app.middleware`` so streaming responses and client disconnects pass
through untouched.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from vllm_volta.entrypoints.openai.errors import error_response

OPEN_PATHS = frozenset({"/health"})  # what a load balancer probes never needs the key


class APIKeyMiddleware:
    """``Authorization: Bearer <key>`` on every route but /health (and /metrics when
    ``metrics_open``), compared in constant time."""

    def __init__(self, app: Any, api_key: str, metrics_open: bool = False) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = OPEN_PATHS | ({"/metrics"} if metrics_open else set())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given = Headers(scope=scope).get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                response = error_response("Unauthorized: missing or invalid API key", 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a request body over ``max_bytes``: at once when Content-Length says so (the
    body is never read), else as soon as the chunks read so far pass the limit."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> str:
        return (f"Request body too large: the limit is {self.max_bytes / 2**20:g} MB "
                "(--max-request-body-mb)")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await error_response(self._too_large(), 413)(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the route's body read: the error handlers answer 413.
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, limited_receive, send)
