"""The request gate: an ASGI middleware in front of the app that checks, before any JSON is parsed,

1. **the API key** (when keys are configured): every path except the open ones (/health, /ping,
   /metrics, /version and the OpenAPI pages) needs ``Authorization: Bearer <key>``, so a client
   without a key learns nothing about the body it sent (malformed JSON without a key is a 401);
2. **the body size**: a declared ``Content-Length`` over the limit is refused without reading a
   byte into the app; a chunked body is refused as soon as it passes the limit (413);
3. **the body-read time**: the whole body must arrive within ``body_timeout`` seconds, or the
   request gets a 408 and the connection is closed (a client cannot hold a connection open with
   an incomplete body).

Refusals are sent *after the rest of the request body has been read and dropped* (up to
``drain_bytes`` and within the body-read time). Closing a socket that still has unread bytes in
its receive buffer makes the kernel reset the connection, and a client that is still sending
(httpx.AsyncClient, AsyncOpenAI) then sees the reset instead of the response; draining first lets
it finish sending and read the 413/401. A client that sends ``Expect: 100-continue`` gets its
refusal at once (it has not sent the body). Bodies beyond ``drain_bytes`` are not drained: those
connections are closed and may be reset.

Bodies within the limit are handed on unchanged (as one message), and later ``receive()`` calls
(``http.disconnect``) go to the client as before, so disconnect detection keeps working.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
DEFAULT_BODY_TIMEOUT = 30.0
OPEN_PATHS = ("/health", "/ping", "/metrics", "/version", "/openapi.json", "/docs", "/redoc")


class _Refusal(Exception):
    def __init__(self, status: int, message: str, code: str, type_: str = "invalid_request_error",
                 headers: Optional[list[tuple[bytes, bytes]]] = None):
        super().__init__(message)
        self.status, self.message, self.code, self.type = status, message, code, type_
        self.headers = headers or []

    def start_and_body(self) -> tuple[Message, Message]:
        raw = json.dumps({"error": {"message": self.message, "type": self.type, "param": None,
                                    "code": self.code}}).encode("utf-8")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                   (b"connection", b"close"), *self.headers]
        return ({"type": "http.response.start", "status": self.status, "headers": headers},
                {"type": "http.response.body", "body": raw})


class _ClientGone(Exception):
    pass


class BodySizeLimitMiddleware:
    """Authenticate, then read the body within ``max_bytes`` and ``body_timeout`` (see the module)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT, auth: Any = None,
                 drain_bytes: Optional[int] = None, open_paths: tuple[str, ...] = OPEN_PATHS):
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if body_timeout <= 0:
            raise ValueError("body_timeout must be positive")
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout = body_timeout
        self.auth = auth if auth is not None and getattr(auth, "enabled", False) else None
        self.drain_bytes = drain_bytes if drain_bytes is not None else max(8 * max_bytes, 2**20)
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.body_timeout
        try:
            self._authenticate(scope)
            declared = _header(scope, b"content-length")
            if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
                raise self._too_large(f"({int(declared)} bytes declared)")
            body = await self._read(receive, deadline)
        except _ClientGone:
            return
        except _Refusal as refusal:
            await self._refuse(scope, receive, send, refusal, deadline)
            return
        await self.app(scope, _replay(body, receive), send)

    # ---- the checks --------------------------------------------------------------------
    def _authenticate(self, scope: Scope) -> None:
        if self.auth is None or _is_open(scope.get("path", ""), self.open_paths):
            return
        value = _header(scope, b"authorization")
        if not self.auth.is_valid(value):
            raise _Refusal(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           "invalid_api_key", "authentication_error", [(b"www-authenticate", b"Bearer")])

    def _too_large(self, what: str) -> _Refusal:
        return _Refusal(413, f"the request body {what} exceeds this server's limit of {self.max_bytes} "
                             "bytes (--max-request-body-bytes)", "request_too_large")

    async def _read(self, receive: Receive, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await _receive_by(receive, deadline, self.body_timeout)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large(f"(more than {self.max_bytes} bytes sent)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # ---- refusing without resetting the connection -------------------------------------
    async def _refuse(self, scope: Scope, receive: Receive, send: Send, refusal: _Refusal,
                      deadline: float) -> None:
        expects_continue = (_header(scope, b"expect") or "").strip().lower() == "100-continue"
        if refusal.status != 408 and not expects_continue:
            try:
                await self._drain(receive, deadline)
            except _ClientGone:
                return
            except _Refusal:  # too much or too slow to drain: answer anyway, then close
                pass
        start, body = refusal.start_and_body()
        await send(start)
        await send(body)

    async def _drain(self, receive: Receive, deadline: float) -> None:
        drained = 0
        while True:
            message = await _receive_by(receive, deadline, self.body_timeout)
            drained += len(message.get("body", b""))
            if not message.get("more_body", False) or drained > self.drain_bytes:
                return


async def _receive_by(receive: Receive, deadline: float, timeout: float) -> Message:
    """The next body message; _Refusal(408) once the deadline has passed, _ClientGone on disconnect."""
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            raise asyncio.TimeoutError
        message = await asyncio.wait_for(receive(), remaining)
    except asyncio.TimeoutError:
        raise _Refusal(408, f"the request body did not arrive within {timeout:g} s "
                            "(--request-body-timeout)", "request_timeout") from None
    if message["type"] != "http.request":  # the client left while sending
        raise _ClientGone()
    return message


def _is_open(path: str, open_paths: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in open_paths)


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
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
