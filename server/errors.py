"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Validation errors are 400 (not FastAPI's 422), unknown routes 404, engine refusals map to 400/503.
Handlers registered by :func:`install_error_handlers` make sure no other shape ever leaves the app.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specserve.engine.errors import EngineDeadError, QueueFullError
from specserve.engine.types import ParamError

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
_PARSE_FAILED = "There was an error parsing the body"  # FastAPI's detail; the cause says why

_DEFAULT_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error to send to the client, already in OpenAI terms."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, type: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _DEFAULT_TYPES.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_engine_error(exc: BaseException) -> APIError:
    """Translate what ``engine.add_request`` (or a running stream) raised into an APIError."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ParamError):
        return APIError(400, exc.message, param=exc.param, code="invalid_value")
    if isinstance(exc, QueueFullError):
        return APIError(503, f"the server is at capacity, retry later ({exc})", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine is not accepting requests: {exc}", code="engine_unavailable",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    logger.exception("internal error", exc_info=exc)
    return APIError(500, f"internal server error: {type(exc).__name__}", code="internal_error")


def _loc_to_param(loc: tuple) -> Optional[str]:
    """('body', 'messages', 0, 'content') -> 'messages.0.content'; a bare body -> None."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    # pydantic appends the union member it tried (e.g. 'str', 'list[int]'): not a field name
    parts = [p for p in parts if not any(c in p for c in "[]") and p not in ("str", "int")]
    return ".".join(parts) or None


def validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
                           code="invalid_json")
    param = _loc_to_param(tuple(first.get("loc", ())))
    if param is None and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return bad_request("the request body must be a JSON object (and sent with "
                           "Content-Type: application/json)", code="invalid_body")
    msgs = []
    for err in errors[:3]:
        where = _loc_to_param(tuple(err.get("loc", ()))) or "body"
        msgs.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return bad_request("; ".join(msgs) + more, param=param, code="invalid_value")


def body_parse_error(cause: BaseException) -> APIError:
    """Why the JSON body could not be read (FastAPI only says "There was an error parsing the body")."""
    if isinstance(cause, RecursionError):
        why = "it is nested too deeply"
    elif isinstance(cause, UnicodeDecodeError):
        why = f"it is not valid UTF-8 (byte {cause.start})"
    else:
        why = str(cause)[:200] or type(cause).__name__
    return bad_request(f"the request body could not be parsed as JSON: {why}", code="invalid_json")


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception FastAPI/Starlette can raise to an OpenAI-shaped response."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None and exc.detail == _PARSE_FAILED:
            return body_parse_error(exc.__cause__).response()
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return from_engine_error(exc).response()
