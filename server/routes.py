"""The endpoints. ``/v1/*``, /tokenize and /detokenize sit behind the API-key check; /health,
/ping, /metrics and /version stay open.

Every status code a route can return is declared in its ``responses`` so the OpenAPI document is
complete (schemathesis checks that nothing undocumented comes back).
"""

from __future__ import annotations

from typing import Any, Union

from fastapi import APIRouter, Depends, Request

from specserve.server import __version__
from specserve.server.auth import APIKeyChecker
from specserve.server.debug import engine_state
from specserve.server.errors import APIError
from specserve.server.metrics import MetricsApp, ServerMetrics
from specserve.server.protocol import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                             CompletionResponse, DetokenizeRequest, DetokenizeResponse, ErrorResponse,
                             HealthResponse, ModelCard, ModelList, SpeculativeInfo, TokenizeChatRequest,
                             TokenizeCompletionRequest, TokenizeResponse, VersionResponse)
from specserve.server.state import ServerState
from specserve.server.serving_chat import create_chat_completion
from specserve.server.serving_completions import create_completion
from specserve.server.serving_tokenize import detokenize_request, tokenize_request

_ERR = {"model": ErrorResponse}
_V1_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {**_ERR, "description": "missing or wrong API key (only when the server has keys)"},
}
_GEN_ERRORS: dict[int | str, dict[str, Any]] = {
    **_V1_ERRORS,
    400: {**_ERR, "description": "invalid request: malformed JSON, wrong types, out-of-range or "
                                 "unsupported fields, prompt too long for the model"},
    404: {**_ERR, "description": "unknown model"},
    413: {**_ERR, "description": "the request body is larger than --max-request-body-bytes"},
    500: {**_ERR, "description": "the engine failed while running the request"},
    503: {**_ERR, "description": "queue full (with Retry-After) or the engine is shutting down/dead",
          "headers": {"Retry-After": {"schema": {"type": "integer"},
                                      "description": "seconds to wait before retrying"}}},
}


def _ok(model: type, description: str) -> dict[int | str, dict[str, Any]]:
    """200 documented as JSON (``model``) or, with ``stream: true``, an SSE stream."""
    event = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string", "description": "a JSON chunk, or [DONE] last"},
                            "event": {"type": "string"}}}
    sse = {"schema": event, "description": "with stream=true: `data: {chunk}` events, then `data: [DONE]`"}
    return {200: {"model": model, "description": description, "content": {"text/event-stream": sse}}}


def state_of(request: Request) -> ServerState:
    return request.app.state.server


def build_router(auth: APIKeyChecker) -> APIRouter:
    router = APIRouter()
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(auth)])

    @v1.post("/completions", response_model=CompletionResponse,
             responses={**_ok(CompletionResponse, "the completion"), **_GEN_ERRORS})
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await create_completion(state_of(request), body, request)

    @v1.post("/chat/completions", response_model=ChatCompletionResponse,
             responses={**_ok(ChatCompletionResponse, "the chat completion"), **_GEN_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await create_chat_completion(state_of(request), body, request)

    @v1.get("/models", response_model=ModelList, responses=_V1_ERRORS)
    async def models(request: Request) -> ModelList:
        state = state_of(request)
        info = state.engine.info
        spec = None
        if info.draft_model_path and info.num_speculative_tokens > 0:
            spec = SpeculativeInfo(draft_model=str(info.draft_model_path),
                                   num_speculative_tokens=info.num_speculative_tokens,
                                   rejection_sample_method=info.rejection_sample_method,
                                   draft_sample_method=info.draft_sample_method)
        names = state.served_model_names or (state.served_model_name,)
        return ModelList(data=[ModelCard(id=name, root=str(info.model_path), max_model_len=info.max_model_len,
                                         speculative=spec) for name in names])

    router.include_router(v1)
    _add_tokenize_routes(router, auth)

    def health_of(request: Request) -> Any:
        engine = state_of(request).engine
        if engine.is_dead:
            return APIError(503, f"the engine is dead: {engine.dead_error}", code="engine_dead").response()
        return HealthResponse(status="ok")

    @router.get("/health", response_model=HealthResponse,
                responses={503: {**_ERR, "description": "the engine is dead"}})
    async def health(request: Request) -> Any:
        return health_of(request)

    @router.get("/ping", response_model=HealthResponse,
                responses={503: {**_ERR, "description": "the engine is dead"}})
    async def ping(request: Request) -> Any:
        """The same check as /health (the probe path some platforms use)."""
        return health_of(request)

    @router.post("/ping", response_model=HealthResponse,
                 responses={503: {**_ERR, "description": "the engine is dead"}})
    async def ping_post(request: Request) -> Any:
        """/ping by POST, as vLLM also accepts it."""
        return health_of(request)

    def before_scrape(app: Any) -> ServerMetrics:
        state: ServerState = app.state.server
        state.metrics.refresh(engine_state(state.engine))
        return state.metrics

    # prometheus-client's ASGI app: Prometheus text, or OpenMetrics when the Accept header asks
    router.add_route("/metrics", MetricsApp(before_scrape), methods=["GET"], include_in_schema=False)

    @router.get("/version", response_model=VersionResponse)
    async def version() -> VersionResponse:
        return VersionResponse(version=__version__)

    return router


_TOKENIZE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_V1_ERRORS,
    400: {**_ERR, "description": "invalid request: malformed JSON, wrong types, token ids outside the "
                                 "vocabulary, messages the chat template cannot render"},
    404: {**_ERR, "description": "unknown model"},
    413: {**_ERR, "description": "the request body is larger than --max-request-body-bytes"},
}


def _add_tokenize_routes(router: APIRouter, auth: APIKeyChecker) -> None:
    """vLLM's /tokenize and /detokenize (behind the API key, like /v1/*)."""

    @router.post("/tokenize", response_model=TokenizeResponse, dependencies=[Depends(auth)],
                 responses=_TOKENIZE_ERRORS)
    async def tokenize(body: Union[TokenizeCompletionRequest, TokenizeChatRequest],
                       request: Request) -> TokenizeResponse:
        return await tokenize_request(state_of(request), body)

    @router.post("/detokenize", response_model=DetokenizeResponse, dependencies=[Depends(auth)],
                 responses=_TOKENIZE_ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        return detokenize_request(state_of(request), body)

