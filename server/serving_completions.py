"""POST /v1/completions: prompts (text or token ids) -> engine -> a response or an SSE stream.

Choice ``i`` of prompt ``p`` gets index ``p * n + i`` (OpenAI's order for list prompts).
"""

from __future__ import annotations

import time
from typing import AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import Response

from specserve.engine.types import Logprob, RequestOutput
from specserve.server.deltas import ChoiceCursor, new_deltas
from specserve.server.errors import bad_request
from specserve.server.generation import Generation, check_failed, new_request_id
from specserve.server.prompt_text import tokenize
from specserve.server.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
                             CompletionStreamResponse, Usage)
from specserve.server.respond import respond, stream_events
from specserve.server.sampling import sampling_params
from specserve.server.state import ServerState
from specserve.server.tokens import clamp_logprob
from specserve.server.tools import constrain, structured_from


async def _prompts(state: ServerState, req: CompletionRequest) -> list[tuple[list[int], Optional[str]]]:
    """(token ids, text) per prompt; text is None for token-id prompts (decoded only for echo)."""
    raw = req.prompt
    if isinstance(raw, str):
        return [(await tokenize(state, raw, "prompt", req.add_special_tokens), raw)]
    if not raw:
        raise bad_request("prompt must not be empty", "prompt")
    limit = state.engine.config.max_waiting_requests
    if not isinstance(raw[0], int) and len(raw) > limit:  # a 503 would invite retries that cannot succeed
        raise bad_request(f"this request has {len(raw)} prompts; at most {limit} (--max-waiting-requests) "
                          "can be queued at once", "prompt")
    if isinstance(raw[0], str):
        for p in raw:  # the cheap length check of every prompt before any is tokenized
            state.preprocess.check_length(len(p), "prompt")
        return [(await tokenize(state, p, "prompt", req.add_special_tokens), p) for p in raw]
    if isinstance(raw[0], int):
        return [(list(raw), None)]
    if any(not ids for ids in raw):
        raise bad_request("token-id prompts must not be empty", "prompt")
    return [(list(ids), None) for ids in raw]


API_DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions


def _max_tokens(state: ServerState, req: CompletionRequest) -> Optional[int]:
    """The request's own max_tokens; else None when the model has a default length (the engine
    applies it, capped by the context); else OpenAI's 16."""
    if req.max_tokens is not None:
        return req.max_tokens
    return None if "max_tokens" in state.generation_defaults else API_DEFAULT_MAX_TOKENS


def _check_supported(req: CompletionRequest) -> None:
    if req.suffix is not None:
        raise bad_request("suffix is not supported by this server", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of must equal n (got best_of={req.best_of}, n={req.n}): "
                          "choosing the best of several samples is not supported", "best_of")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo together with logprobs is not supported: prompt logprobs are not "
                          "computed", "echo")


def _logprobs(state: ServerState, lps: list[Logprob], offset: int) -> CompletionLogprobs:
    """The legacy completions logprobs block for ``lps``; text offsets start at ``offset``."""
    block = CompletionLogprobs()
    for lp in lps:
        text = state.token_text.text(lp.token_id)
        block.tokens.append(text)
        block.token_logprobs.append(clamp_logprob(lp.logprob))
        top: dict[str, float] = {}
        for t, v in lp.top:  # best first; tokens with the same text (e.g. partial bytes) keep the best
            top.setdefault(state.token_text.text(t), clamp_logprob(v))
        block.top_logprobs.append(top)
        block.text_offset.append(offset)
        offset += len(text)
    return block


class _Echo:
    """Prompt text per prompt index (decoded lazily from ids for token-id prompts)."""

    def __init__(self, state: ServerState, prompts: list[tuple[list[int], Optional[str]]]):
        self._state = state
        self._prompts = prompts

    def text(self, index: int) -> str:
        ids, text = self._prompts[index]
        return text if text is not None else self._state.tokenizer.decode(ids)


async def create_completion(state: ServerState, req: CompletionRequest,
                            http: Request) -> CompletionResponse | Response:
    state.check_model(req.model)
    _check_supported(req)
    params = sampling_params(req, max_tokens=_max_tokens(state, req), logprobs=req.logprobs,
                             defaults=state.generation_defaults)
    prompts = await _prompts(state, req)
    params = constrain(params, structured_from(req))   # response_format / structured_outputs
    request_id = new_request_id("cmpl")
    gen = await Generation.start(state, request_id, prompts, params)
    echo = _Echo(state, prompts) if req.echo else None
    stream = _stream(state, req, gen, request_id, echo) if req.stream else None
    return await respond(gen, http, stream,
                         lambda finals: _full_response(state, req, request_id, finals, gen, echo))


def _full_response(state: ServerState, req: CompletionRequest, request_id: str,
                   finals: list[RequestOutput], gen: Generation, echo: Optional[_Echo]) -> CompletionResponse:
    choices = []
    for p_idx, out in enumerate(finals):
        prefix = echo.text(p_idx) if echo else ""
        for comp in out.outputs:
            check_failed(comp)
            lps = _logprobs(state, comp.logprobs or [], 0) if req.logprobs is not None else None
            choices.append(CompletionChoice(
                index=p_idx * req.n + comp.index, text=prefix + comp.text, logprobs=lps,
                finish_reason=str(comp.finish_reason), stop_reason=comp.stop_reason,
                prompt_token_ids=out.prompt_token_ids if req.return_token_ids else None,
                token_ids=list(comp.token_ids) if req.return_token_ids else None))
    choices.sort(key=lambda c: c.index)
    return CompletionResponse(id=request_id, model=state.served_model_name, choices=choices,
                              usage=gen.usage())


def _stream(state: ServerState, req: CompletionRequest, gen: Generation, request_id: str,
            echo: Optional[_Echo]) -> AsyncIterator[str]:
    created = int(time.time())
    cursors: dict[int, ChoiceCursor] = {}
    offsets: dict[int, int] = {}

    def body(choices: list[CompletionChoice], usage: Optional[Usage]) -> CompletionStreamResponse:
        return CompletionStreamResponse(id=request_id, created=created, model=state.served_model_name,
                                        choices=choices, usage=usage)

    def choices_of(p_idx: int, out: RequestOutput) -> list[CompletionChoice]:
        def cursor_of(i: int) -> ChoiceCursor:
            return cursors.setdefault(p_idx * req.n + i, ChoiceCursor())

        choices = []
        for comp, delta in new_deltas(out, cursor_of):
            index = p_idx * req.n + comp.index
            text = echo.text(p_idx) + delta.text if delta.first and echo else delta.text
            offset = offsets.get(index, 0)
            block = _logprobs(state, delta.logprobs, offset) if req.logprobs is not None else None
            if block:
                offsets[index] = offset + sum(len(t) for t in block.tokens)
            choices.append(CompletionChoice(
                index=index, text=text, logprobs=block,
                finish_reason=str(comp.finish_reason) if delta.done else None,
                stop_reason=comp.stop_reason if delta.done else None,
                prompt_token_ids=out.prompt_token_ids if delta.first and req.return_token_ids else None,
                token_ids=delta.token_ids if req.return_token_ids else None))
        return choices

    return stream_events(gen, req.stream_options, body, choices_of)
