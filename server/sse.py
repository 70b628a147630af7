"""Server-sent events framing: ``data: {json}\\n\\n`` per event, an error event, ``data: [DONE]``."""

from __future__ import annotations

import json

from specserve.server.errors import from_engine_error

SSE_DONE = "data: [DONE]\n\n"


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


def sse_error(exc: BaseException) -> str:
    """An error inside a stream: one ``data: {"error": ...}`` event (the caller then sends [DONE])."""
    return sse(json.dumps(from_engine_error(exc).body()))
