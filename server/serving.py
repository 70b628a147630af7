"""Protocol <-> engine: prompts and sampling fields in, engine requests run, outputs back out.

``CompletionRequest -> (prompt ids, SamplingParams) -> engine.add_request -> RequestOutput stream``.
A :class:`Generation` owns the engine requests of one HTTP request (one per prompt; ``n`` choices
each) and guarantees that whatever happens to the HTTP side (client gone, error, cancellation),
unfinished engine requests are aborted, which frees their KV blocks and draft probabilities.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional, TypeVar

import anyio
from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from specserve.engine.types import (CompletionOutput, FinishReason, Logprob, ParamError, RequestOutput,
                          SamplingParams, SpecDecodeStats)
from specserve.server.errors import APIError, bad_request, from_engine_error
from specserve.server.metrics import RequestTracker, ServerMetrics
from specserve.server.protocol import PromptTokensDetails, SamplingFields, SpecDecodeUsage, Usage
from specserve.server.tokens import TokenText

logger = logging.getLogger(__name__)

T = TypeVar("T")
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; OpenAI clients expect a number


@dataclass
class ServerState:
    """What every endpoint needs: the engine, its tokenizer, the served names and the metrics.

    ``served_model_name`` is the first of ``served_model_names``: responses report it, requests
    may name any of them.
    """

    engine: Any
    served_model_name: str
    metrics: ServerMetrics
    token_text: TokenText
    served_model_names: tuple[str, ...] = ()
    preprocess: Any = None  # a Preprocessor: tokenization and chat templates off the event loop

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def spec_enabled(self) -> bool:
        return self.engine.info.num_speculative_tokens > 0

    @property
    def generation_defaults(self) -> Mapping[str, Any]:
        """Request defaults from the model's generation config (``--generation-config``)."""
        return self.engine.info.generation_defaults

    def check_model(self, name: Optional[str]) -> None:
        if name is None or name in (self.served_model_name, *self.served_model_names,
                                    self.engine.info.model_path):
            return
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                            f"'{self.served_model_name}'", param="model", code="model_not_found")


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def clamp_logprob(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def check_text(value: str, param: str) -> str:
    """Reject strings that cannot be UTF-8 (lone surrogates arrive through JSON \\ud800 escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{param} is not valid Unicode text (lone surrogate)", param=param) from None
    return value


async def tokenize(state: ServerState, text: str, param: str, add_special_tokens: bool) -> list[int]:
    """Token ids of a prompt text, computed in the preprocessing pool (never on the event loop)."""
    state.preprocess.check_length(len(text), param)  # first: the cheapest refusal of a huge text
    check_text(text, param)
    return await state.preprocess.tokenize(text, param, add_special_tokens)


def _logit_bias(raw: Optional[dict[str, float]]) -> Optional[dict[int, float]]:
    """JSON's string keys -> token ids (the engine checks that they are in the vocabulary)."""
    if not raw:
        return None
    try:
        return {int(key): value for key, value in raw.items()}
    except ValueError:
        raise bad_request(f"logit_bias keys must be token ids, got {sorted(raw)[:3]}", "logit_bias") from None


_DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def with_defaults(req: SamplingFields, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields the model's generation config may default: the request's own value
    when it sent one (not null), else the model's default, else the API's."""
    sent = req.model_fields_set
    return {name: getattr(req, name) if name in sent else defaults.get(name, getattr(req, name))
            for name in _DEFAULTED_FIELDS}


def sampling_params(req: SamplingFields, *, max_tokens: Optional[int], logprobs: Optional[int],
                    defaults: Optional[Mapping[str, Any]] = None) -> SamplingParams:
    """The shared sampling fields -> engine SamplingParams (engine refusals become 400s).

    ``defaults``: the model's generation defaults, for the fields the request did not send.
    """
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    for s in stop:
        check_text(s, "stop")
    knobs = with_defaults(req, defaults or {})
    try:
        return SamplingParams(
            n=req.n, temperature=knobs["temperature"], top_p=knobs["top_p"],
            top_k=knobs["top_k"] if knobs["top_k"] is not None else 0,
            min_p=knobs["min_p"] if knobs["min_p"] is not None else 0.0,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=knobs["repetition_penalty"] if knobs["repetition_penalty"] is not None else 1.0,
            logit_bias=_logit_bias(req.logit_bias),
            seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens, stop=stop,
            stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
            logprobs=logprobs, include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens)
    except ParamError as e:
        raise from_engine_error(e) from None


def usage_of(state: ServerState, prompt_lens: list[int],
             outputs: list[Optional[RequestOutput]]) -> Usage:
    """Usage over all prompts and choices; ``spec_decode`` merges the per-sequence counters;
    ``prompt_tokens_details.cached_tokens`` counts each prompt's prefix-cache hits once (as
    ``prompt_tokens`` counts each prompt once)."""
    completion = cached = 0
    spec = SpecDecodeStats()
    for out in outputs:
        if out is not None:
            cached += out.num_cached_prompt_tokens
        for comp in (out.outputs if out is not None else []):
            completion += len(comp.token_ids)
            spec.merge(comp.spec_decode)
    prompt = sum(prompt_lens)
    block = SpecDecodeUsage(**spec.as_dict()) if state.spec_enabled else None
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached), spec_decode=block)


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
        return usage_of(self._state, self.prompt_lens, self.latest)

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


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientDisconnected(Exception):
    """The client went away before the (non-streaming) response was ready."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first (then cancel it, raise ClientDisconnected)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        task.cancel()


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(exc: BaseException) -> str:
    """An error inside a stream: one ``data: {"error": ...}`` event (the caller then sends [DONE])."""
    return sse(json.dumps(from_engine_error(exc).body()))


def usage_options(opts: Any) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a request's ``stream_options`` (may be None)."""
    include = bool(opts and opts.include_usage)
    return include, include and bool(opts and opts.continuous_usage_stats)


async def stream_chunks(gen: "Generation", choices_of: Callable[[int, RequestOutput], list],
                        chunk: Callable[[list, bool], str], include_usage: bool,
                        continuous: bool) -> AsyncIterator[str]:
    """An SSE stream's events after any opening ones: a chunk for every engine output that has
    something new (``choices_of(prompt index, output)`` builds its choices), the usage chunk if
    asked for, an error event if anything fails, then [DONE]."""
    try:
        async for p_idx, out in gen.outputs():
            choices = choices_of(p_idx, out)
            if choices:
                yield chunk(choices, continuous)
        if include_usage:
            yield chunk([], True)
    except Exception as e:  # noqa: BLE001 - any failure becomes an error event, then [DONE]
        yield sse_error(e)
    yield SSE_DONE


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


@dataclass
class ChoiceCursor:
    """How much of one choice's cumulative text / tokens / logprobs a stream has already sent."""

    text: int = 0
    tokens: int = 0
    logprobs: int = 0
    done: bool = False

    def advance(self, comp: CompletionOutput) -> tuple[str, list[int], list[Logprob]]:
        """The unsent parts of ``comp``; marks them sent."""
        text, self.text = comp.text[self.text:], len(comp.text)
        ids, self.tokens = comp.token_ids[self.tokens:], len(comp.token_ids)
        all_lps = comp.logprobs or []
        lps, self.logprobs = all_lps[self.logprobs:], len(all_lps)
        self.done = comp.finish_reason is not None
        return text, ids, lps


def check_failed(comp: CompletionOutput) -> None:
    """A choice the engine failed to run (finish_reason ``error``) becomes an APIError."""
    if comp.finish_reason == FinishReason.ERROR:
        raise APIError(500, f"the engine failed while running this request: {comp.error or 'unknown error'}",
                       code="engine_error")
