"""Bearer-key authentication for ``/v1/*`` (``/health``, ``/metrics`` and ``/version`` stay open)."""

from __future__ import annotations

import hmac
from typing import Sequence

from fastapi import Request

from specserve.server.errors import APIError


class APIKeyChecker:
    """A FastAPI dependency: ``Authorization: Bearer <key>`` must match one of the configured keys.

    Every configured key is compared (constant-time per key, no early exit) so that the response
    time does not reveal which key, or how much of one, matched. No keys configured = open server.
    """

    def __init__(self, keys: Sequence[str]):
        self._keys = [k.encode("utf-8") for k in keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def is_valid(self, header_value: str | None) -> bool:
        scheme, _, token = (header_value or "").partition(" ")
        presented = token.strip().encode("utf-8", "surrogateescape")
        ok = scheme.lower() == "bearer" and bool(presented)
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        return ok and matched

    async def __call__(self, request: Request) -> None:
        if not self._keys:
            return
        if not self.is_valid(request.headers.get("authorization")):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
