"""Time every HTTP request on the server's side: ``http_request_duration_seconds``.

The outermost ASGI layer: the clock starts when the app first sees a request (uvicorn has parsed
its headers) and stops when the last byte of the response is handed to the transport, or when the
app returns without finishing one. Labels, each from a fixed set so that neither a scanner nor an
odd method can grow the series: method (the HTTP methods, else "other"), handler (one of the API's
paths, else "other") and status class ("2xx", ...; "5xx" for an exception that escapes the app
before a response started, which the error handler outside this layer answers with a 500; "none"
if the app returned without a response, a client gone). Beside the engine's own
``e2e_request_latency_seconds``, a request slow here but not there lost its time around the
engine: reading its body, waiting for the event loop, building or writing its response.
"""

from __future__ import annotations

import time
from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"})
TIMED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                         "/metrics", "/tokenize", "/detokenize", "/version", "/ping", "/debug/state"})


class HTTPTimingMiddleware:
    def __init__(self, app: ASGIApp, observe: Callable[[str, str, str, float], None]):
        self.app = app
        self.observe = observe      # (method, handler, status, seconds): ServerMetrics.observe_http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = ["none"]
        observed = [False]
        path = scope.get("path", "")
        handler = path if path in TIMED_PATHS else "other"
        method = scope.get("method", "")
        method = method if method in METHODS else "other"

        def observe() -> None:
            if not observed[0]:
                observed[0] = True
                self.observe(method, handler, status[0], time.monotonic() - start)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = f"{message['status'] // 100}xx"
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                observe()

        try:
            await self.app(scope, receive, timed_send)
        except Exception:
            if status[0] == "none":
                status[0] = "5xx"
            raise
        finally:
            observe()
