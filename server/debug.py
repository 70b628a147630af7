"""Operator and test endpoints, behind the same API-key check as ``/v1/*``.

* ``GET /debug/state``: what the engine holds right now (KV blocks, unfinished requests, bytes of
  stored draft probabilities, open streams). After all traffic has ended every block is free and
  nothing is held: reliability tests and operators check that nothing leaked.
* ``POST /debug/fault``: TEST ONLY, registered only with ``--enable-test-hooks``. The next engine
  step raises; the engine then fails every in-flight request, /health turns 503 and (by default)
  the process exits non-zero so that Kubernetes restarts it.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from specserve.server.auth import APIKeyChecker
from specserve.server.errors import APIError
from specserve.server.protocol import ErrorResponse


class DebugState(BaseModel):
    """A snapshot of the engine's resources (extra engine-specific keys may appear)."""

    model_config = ConfigDict(extra="allow")

    num_free_blocks: int
    num_total_blocks: int
    num_unfinished_requests: int
    draft_prob_bytes: int
    num_streams: int
    engine_dead: bool
    dead_error: Optional[str] = None


class FaultRequest(BaseModel):
    message: str = Field("injected fault", min_length=1, max_length=1000,
                         description="the text of the exception the next step raises")


class FaultResponse(BaseModel):
    injected: bool
    message: str


_ERR = {"model": ErrorResponse}
_AUTH = {401: {**_ERR, "description": "missing or wrong API key (only when the server has keys)"}}


def engine_state(engine: Any) -> dict[str, Any]:
    """``engine.debug_state()`` as a dict. Safe from the event loop while the step thread runs:
    the engine reports counters and container sizes only, never iterates a live container."""
    return dict(engine.debug_state())


def build_debug_router(auth: APIKeyChecker, enable_test_hooks: bool) -> APIRouter:
    router = APIRouter(prefix="/debug", dependencies=[Depends(auth)], tags=["debug"])

    @router.get("/state", response_model=DebugState, responses=_AUTH)
    async def state(request: Request) -> DebugState:
        engine = request.app.state.server.engine
        snapshot = engine_state(engine)
        return DebugState(**snapshot, engine_dead=bool(engine.is_dead), dead_error=engine.dead_error)

    if enable_test_hooks:
        @router.post("/fault", response_model=FaultResponse,
                     responses={**_AUTH, 400: {**_ERR, "description": "invalid body"},
                                503: {**_ERR, "description": "the engine is already dead"}},
                     description="TEST ONLY (--enable-test-hooks): make the next engine step raise.")
        async def fault(body: FaultRequest, request: Request) -> FaultResponse:
            engine = request.app.state.server.engine
            if engine.is_dead:
                raise APIError(503, f"the engine is already dead: {engine.dead_error}", code="engine_dead")
            engine.inject_fault(body.message)
            return FaultResponse(injected=True, message=body.message)

    return router
