"""The engine requests of one HTTP request: started together, read together, aborted together.

``(prompt ids, SamplingParams) -> engine.add_request -> RequestOutput stream``. A
:class:`Generation` owns the engine requests of one HTTP request (one per prompt; ``n`` choices
each) and guarantees that whatever happens to the HTTP side (client gone, error, cancellation),
unfinished engine requests are aborted, which frees their KV blocks and draft probabilities.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

import anyio

from specserve.engine.types import CompletionOutput, FinishReason, RequestOutput, SamplingParams
from specserve.server.errors import APIError, from_engine_error
from specserve.server.metrics import RequestTracker
from specserve.server.protocol import Usage
from specserve.server.state import ServerState
from specserve.server.usage import usage_of

logger = logging.getLogger(__name__)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class _Item:
    request_id: str
    prompt_ids: list[int]
    stream: Any
    tracker: RequestTracker
    finished: bool = False


class Generation:
    """The engine requests of one HTTP request: one per prompt, each with ``params.n`` choices."""

    def __init__(self, state: ServerState):
        self._state = state
        self.items: list[_Item] = []
        self.latest: list[Optional[RequestOutput]] = []  # per prompt, the newest output
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    @classmethod
    async def start(cls, state: ServerState, request_id: str,
                    prompts: list[tuple[list[int], Optional[str]]], params: SamplingParams) -> "Generation":
        """Add every prompt to the engine; on any refusal, abort the ones already added and raise."""
        gen = cls(state)
        for i, (ids, text) in enumerate(prompts):
            rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            try:
                stream = state.engine.add_request(rid, ids, params, prompt_text=text)
            except Exception as e:
                await gen.close()
                raise from_engine_error(e) from None
            gen.items.append(_Item(rid, ids, stream, state.metrics.track(len(ids), params.n)))
            gen.latest.append(None)
        return gen

    @property
    def prompt_lens(self) -> list[int]:
        return [len(item.prompt_ids) for item in self.items]

    def usage(self) -> Usage:
        return usage_of(self._state.spec_enabled, self.prompt_lens, self.latest)

    def _record(self, index: int, out: RequestOutput) -> None:
        item = self.items[index]
        item.tracker.update(out)
        self.latest[index] = out
        item.finished = out.finished

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, cumulative RequestOutput) as they arrive, interleaved across prompts."""
        if len(self.items) == 1:
            async for out in self.items[0].stream:
                self._record(0, out)
                yield 0, out
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async for out in self.items[index].stream:
                    queue.put_nowait((index, out))
                queue.put_nowait((index, None))
            except Exception as e:  # handed to the consumer, which raises it
                queue.put_nowait((index, e))

        self._tasks = [asyncio.create_task(pump(i)) for i in range(len(self.items))]
        remaining = len(self.items)
        while remaining:
            index, out = await queue.get()
            if out is None:
                remaining -= 1
                continue
            if isinstance(out, BaseException):
                raise out
            self._record(index, out)
            yield index, out

    async def collect(self) -> list[RequestOutput]:
        """Run to the end; the final output of each prompt. An engine error (the engine died, or
        the shutdown deadline ended the request) is raised as the APIError the client gets."""
        try:
            async for _ in self.outputs():
                pass
        except APIError:
            raise
        except Exception as e:  # noqa: BLE001 - an OpenAI-shaped answer instead of a traceback
            raise from_engine_error(e) from None
        return [out for out in self.latest if out is not None]

    async def close(self) -> None:
        """Abort what has not finished (idempotent, safe under cancellation)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for task in self._tasks:
                task.cancel()
            for item in self.items:
                if not item.finished:
                    try:
                        await self._state.engine.abort(item.request_id)
                    except Exception:  # the engine may already be gone; nothing left to free
                        logger.debug("abort of %s failed", item.request_id, exc_info=True)
                item.tracker.abort_unfinished()


def check_failed(comp: CompletionOutput) -> None:
    """A choice the engine failed to run (finish_reason ``error``) becomes an APIError."""
    if comp.finish_reason == FinishReason.ERROR:
        raise APIError(500, f"the engine failed while running this request: {comp.error or 'unknown error'}",
                       code="engine_error")
