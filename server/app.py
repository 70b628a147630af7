"""``create_app(engine, ...)``: the FastAPI application around an (already loaded) AsyncEngine.

The lifespan starts the engine's step thread inside the running event loop and, on shutdown
(uvicorn has by then drained or cut the open connections), shuts the engine down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional, Sequence, Union

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from specserve.server import __version__
from specserve.server.auth import APIKeyChecker
from specserve.server.debug import build_debug_router
from specserve.server.errors import install_error_handlers
from specserve.server.http_timing import HTTPTimingMiddleware
from specserve.server.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, BodySizeLimitMiddleware
from specserve.server.metrics import ServerMetrics
from specserve.server.preprocess import DEFAULT_TEMPLATE_TIMEOUT, DEFAULT_WORKERS, Preprocessor
from specserve.server.routes import build_router
from specserve.server.state import ServerState
from specserve.server.stats_log import StatsLogger
from specserve.server.tokens import TokenText

logger = logging.getLogger(__name__)


def _strip_422(schema: dict[str, Any]) -> dict[str, Any]:
    """Validation errors are 400s here, so FastAPI's automatic 422 entries would be lies."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    schemas = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return schema


def _served_names(engine: Any, given: Union[str, Sequence[str], None]) -> tuple[str, ...]:
    names = (given,) if isinstance(given, str) else tuple(given or ())
    return tuple(dict.fromkeys(n for n in names if n)) or (engine.info.served_model_name,)


def create_app(engine: Any, *, tool_options: Any = None,
               served_model_name: Union[str, Sequence[str], None] = None,
               api_keys: Sequence[str] = (), shutdown_timeout: float = 30.0,
               registry: Optional[CollectorRegistry] = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, enable_test_hooks: bool = False,
               metrics_prefix: str = "specserve", log_stats_interval: Optional[float] = None,
               body_timeout: float = DEFAULT_BODY_TIMEOUT, preprocess_workers: int = DEFAULT_WORKERS,
               trust_request_chat_template: bool = False,
               chat_template_timeout: float = DEFAULT_TEMPLATE_TIMEOUT) -> FastAPI:
    """The OpenAI-compatible app serving ``engine`` (an ``engine.AsyncEngine``, not yet started).

    Request bodies over ``max_body_bytes`` get a 413. ``enable_test_hooks`` adds the test-only
    ``POST /debug/fault`` (never in production). ``metrics_prefix`` "vllm" exports vLLM's metric
    names and ``engine`` label. ``served_model_name``: one name or several (the first is reported,
    requests may use any); default the engine's. ``log_stats_interval``: seconds between stats log
    lines (None: no stats log). ``body_timeout``: seconds a request body may take to arrive (408).
    Tokenization and chat templates run in ``preprocess_workers`` threads; chat templates sent by
    clients are refused unless ``trust_request_chat_template`` (then rendered in a child process
    within ``chat_template_timeout`` seconds).
    """
    names = _served_names(engine, served_model_name)
    name = names[0]
    metrics = ServerMetrics(name, engine.info.num_speculative_tokens, registry, metrics_prefix)
    state = ServerState(engine=engine, served_model_name=name, metrics=metrics,
                        token_text=TokenText(engine.tokenizer), served_model_names=names,
                        preprocess=Preprocessor(engine.tokenizer, engine.info.max_model_len,
                                                workers=preprocess_workers,
                                                trust_request_chat_template=trust_request_chat_template,
                                                template_timeout=chat_template_timeout,
                                                fallback_render_cap=2 * max_body_bytes))
    stats_log = StatsLogger(engine, log_stats_interval) if log_stats_interval else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.add_step_listener(metrics.on_step)
        if stats_log is not None:
            engine.add_step_listener(stats_log.on_step)
        await engine.start()
        logger.debug("engine started; serving model %r", name)
        stats_task = asyncio.create_task(stats_log.run()) if stats_log is not None else None
        try:
            yield
        finally:
            if stats_task is not None:
                stats_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stats_task
            logger.info("shutting down: draining in-flight requests (up to %.0fs)", shutdown_timeout)
            await engine.shutdown(timeout=shutdown_timeout)
            state.preprocess.close()
            logger.info("engine stopped")

    app = FastAPI(title="specserve", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible server with lossless speculative decoding "
                              "(a separate draft model).")
    app.state.server = state
    app.state.stats_log = stats_log
    state.tools = tool_options   # server/tools.py: ToolOptions (None: no auto tool choice)
    install_error_handlers(app)
    auth = APIKeyChecker(api_keys)
    # the key, then the body's size and arrival time: all before any JSON is parsed
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes, body_timeout=body_timeout,
                       auth=auth)
    # outermost (added last): the HTTP side's clock starts before the key and body checks
    app.add_middleware(HTTPTimingMiddleware, observe=metrics.observe_http)
    app.include_router(build_router(auth))
    app.include_router(build_debug_router(auth, enable_test_hooks))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _strip_422(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
