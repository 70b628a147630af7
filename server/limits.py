"""Request-body size limit: an ASGI middleware that answers 413 before the body reaches JSON parsing.

A declared ``Content-Length`` over the limit is refused without reading a byte of the body; a
chunked body is read up to the limit and refused as soon as it passes it. Bodies within the limit
are handed on unchanged (as one message), and later ``receive()`` calls (``http.disconnect``) go to
the client as before, so disconnect detection keeps working.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 8 * 2**20


def _too_large(limit: int, what: str) -> tuple[dict[str, Any], bytes]:
    body = {"error": {"message": f"the request body {what} exceeds this server's limit of {limit} bytes "
                                 "(--max-request-body-bytes)",
                      "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
    raw = json.dumps(body).encode("utf-8")
    start = {"type": "http.response.start", "status": 413,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode()), (b"connection", b"close")]}
    return start, raw


class BodySizeLimitMiddleware:
    """Refuse HTTP request bodies larger than ``max_bytes`` with an OpenAI-shaped 413."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, f"({declared} bytes declared)")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, f"(more than {self.max_bytes} bytes sent)")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, send: Send, what: str) -> None:
        start, raw = _too_large(self.max_bytes, what)
        await send(start)
        await send({"type": "http.response.body", "body": raw})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that first returns the buffered body, then defers to the client's."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
