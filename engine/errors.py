"""Errors the engine raises towards its callers (the server maps them to HTTP statuses)."""

from __future__ import annotations

from specserve.engine.types import ParamError


class QueueFullError(RuntimeError):
    """Too many requests are waiting; the caller should retry later (HTTP 503 + Retry-After)."""

    def __init__(self, num_waiting: int, limit: int):
        super().__init__(f"the server is overloaded: {num_waiting} requests are waiting "
                         f"(limit {limit}); retry later")
        self.num_waiting = num_waiting
        self.limit = limit


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (failure or shutdown) and accepts no new requests."""


class CapacityError(ParamError):
    """A request that could never fit into the KV cache, whatever else is running."""


__all__ = ["ParamError", "QueueFullError", "EngineDeadError", "CapacityError"]
