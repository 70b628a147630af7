"""The tail both generation endpoints share: a started Generation -> the HTTP answer.

Streamed: the endpoint's chunks as SSE events, the usage chunk if asked for, an error event if
anything fails, then ``[DONE]``. Not streamed: the final outputs, built into one body by the
endpoint. Either way the Generation is closed (unfinished engine requests aborted) when the HTTP
side ends: the stream finishes or breaks, or the client disconnects (answered with a 499).
"""

from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable, Optional, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from specserve.engine.types import RequestOutput
from specserve.server.disconnect import ClientDisconnected, until_disconnect
from specserve.server.generation import Generation
from specserve.server.protocol import Usage
from specserve.server.sse import SSE_DONE, sse, sse_error
from specserve.server.usage import usage_options

T = TypeVar("T")


class GenerationStreamResponse(StreamingResponse):
    """An SSE response that always closes its Generation: end, error, or client disconnect."""

    def __init__(self, body: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


async def respond(gen: Generation, http: Request, stream: Optional[AsyncIterator[str]],
                  full: Callable[[list[RequestOutput]], T]) -> T | Response:
    """``stream`` (the SSE events) if the request streams, else ``full(final outputs)``; a client
    gone before the full body is ready gets a 499. ``gen`` is closed in every case."""
    if stream is not None:
        return GenerationStreamResponse(stream, gen.close)
    try:
        finals = await until_disconnect(http, gen.collect())
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        await gen.close()
    return full(finals)


async def stream_events(gen: Generation, stream_options: object,
                        body: Callable[[list, Optional[Usage]], BaseModel],
                        choices_of: Callable[[int, RequestOutput], list],
                        opening: Optional[Callable[[Optional[Usage]], BaseModel]] = None
                        ) -> AsyncIterator[str]:
    """A stream's SSE events: the ``opening`` chunk if any, then a chunk for every engine output
    that has something new (``choices_of(prompt index, output)`` builds its choices, ``body(choices,
    usage)`` the endpoint's chunk), the usage chunk if ``stream_options`` asks for it, an error
    event if anything fails, then [DONE]. With continuous usage stats every chunk carries usage."""
    include_usage, continuous = usage_options(stream_options)

    def usage(wanted: bool) -> Optional[Usage]:
        return gen.usage() if wanted else None

    if opening is not None:
        yield sse(opening(usage(continuous)).model_dump_json())
    try:
        async for p_idx, out in gen.outputs():
            choices = choices_of(p_idx, out)
            if choices:
                yield sse(body(choices, usage(continuous)).model_dump_json())
        if include_usage:
            yield sse(body([], usage(True)).model_dump_json())
    except Exception as e:  # noqa: BLE001 - any failure becomes an error event, then [DONE]
        yield sse_error(e)
    yield SSE_DONE
