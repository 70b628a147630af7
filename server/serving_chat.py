"""POST /v1/chat/completions: messages -> the tokenizer's chat template -> engine -> response / SSE.

Streams send each choice's ``{"role": "assistant", "content": ""}`` delta first, then content deltas,
then a chunk with the finish reason (and, when asked, a usage chunk with no choices).
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import Response

from specserve.engine.types import Logprob, RequestOutput
from specserve.server.deltas import ChoiceCursor, new_deltas
from specserve.server.errors import APIError, bad_request
from specserve.server.generation import Generation, check_failed, new_request_id
from specserve.server.prompt_text import check_text, tokenize
from specserve.server.protocol import (ChatChoice, ChatChoiceLogprobs, ChatCompletionRequest,
                             ChatCompletionResponse, ChatCompletionStreamResponse, ChatLogprobEntry,
                             ChatResponseMessage, ChatStreamChoice, DeltaMessage, TopLogprob, Usage)
from specserve.server.respond import respond, stream_events
from specserve.server.sampling import sampling_params
from specserve.server.state import ServerState
from specserve.server.tokens import clamp_logprob
from specserve.server.tools import ToolPlan, tool_fields


def _message_dicts(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: content always a string (text parts joined)."""
    out = []
    for i, msg in enumerate(req.messages):
        content = msg.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise bad_request(f"messages[{i}]: only text content parts are supported "
                                      f"(got type {part.type!r})", f"messages.{i}.content")
                texts.append(part.text)
            content = "\n".join(texts)
        entry: dict[str, Any] = {"role": msg.role, "content": check_text(content or "", "messages")}
        if msg.name is not None:
            entry["name"] = msg.name
        entry.update(tool_fields(msg))
        out.append(entry)
    return out


def _check_supported(req: ChatCompletionRequest) -> None:
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    if req.add_generation_prompt and req.continue_final_message:
        raise bad_request("add_generation_prompt and continue_final_message cannot both be true",
                          "continue_final_message")


async def _prompt(state: ServerState, req: ChatCompletionRequest) -> tuple[list[int], str]:
    text = await render_chat(state, req)
    return await tokenize(state, text, "messages", add_special_tokens=False), text


def _content_chars(messages: list[Any]) -> int:
    return sum(len(m.content) if isinstance(m.content, str) else
               sum(len(p.text or "") for p in m.content or ()) for m in messages)


def request_template(state: ServerState, req: Any, kwargs: dict[str, Any]) -> Optional[str]:
    """A chat template sent with the request (``chat_template`` or ``chat_template_kwargs.chat_template``,
    removed from ``kwargs``): None if there is none; a 400 unless the server trusts such templates."""
    sent = [(name, value) for name, value in (("chat_template", getattr(req, "chat_template", None)),
                                              ("chat_template_kwargs.chat_template",
                                               kwargs.pop("chat_template", None))) if value is not None]
    if not sent:
        return None
    param, source = sent[0]
    if not state.preprocess.trust_request_chat_template:
        raise APIError(400, "chat templates sent with a request are not accepted by this server (it runs "
                            "without --trust-request-chat-template); leave out chat_template to use the "
                            "model's own", param=param, code="chat_template_not_allowed")
    if not isinstance(source, str):
        raise bad_request(f"{param} must be a string (a Jinja template)", param)
    return source


async def render_chat(state: ServerState, req: Any) -> str:
    """The prompt text the chat template makes of ``req.messages`` (``req``: a chat completion or a
    /tokenize chat request; both carry the template fields), rendered off the event loop."""
    state.preprocess.check_length(_content_chars(req.messages), "messages")  # before any copy of them
    kwargs = dict(req.chat_template_kwargs or {})
    template = request_template(state, req, kwargs)
    if template is None and not getattr(state.tokenizer, "chat_template", None):
        raise bad_request("this model's tokenizer has no chat template; use /v1/completions", "messages")
    messages = _message_dicts(req)
    kwargs.update(tokenize=False, add_generation_prompt=req.add_generation_prompt,
                  continue_final_message=req.continue_final_message)
    return await state.preprocess.render_chat(messages, kwargs, template)


def _logprobs(state: ServerState, lps: list[Logprob]) -> ChatChoiceLogprobs:
    tt = state.token_text
    return ChatChoiceLogprobs(content=[
        ChatLogprobEntry(token=tt.text(lp.token_id), logprob=clamp_logprob(lp.logprob),
                         bytes=tt.bytes(lp.token_id),
                         top_logprobs=[TopLogprob(token=tt.text(t), logprob=clamp_logprob(v),
                                                  bytes=tt.bytes(t)) for t, v in lp.top])
        for lp in lps])


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest,
                                 http: Request) -> ChatCompletionResponse | Response:
    state.check_model(req.model)
    _check_supported(req)
    plan = ToolPlan.for_request(state, req)   # tools for the template, constraints, reply parsing
    req = plan.request
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    # no max_tokens: the engine applies the model's default length, capped by the context
    params = sampling_params(req, max_tokens=max_tokens, logprobs=logprobs,
                             defaults=state.generation_defaults)
    ids, text = await _prompt(state, req)
    params = plan.constrain(params)
    request_id = new_request_id("chatcmpl")
    gen = await Generation.start(state, request_id, [(ids, text)], params)
    stream = _stream(state, req, gen, request_id, plan) if req.stream else None
    return await respond(gen, http, stream,
                         lambda finals: _full_response(state, req, request_id, finals[0], gen, plan))


def _full_response(state: ServerState, req: ChatCompletionRequest, request_id: str, out: RequestOutput,
                   gen: Generation, plan: ToolPlan) -> ChatCompletionResponse:
    choices = []
    for comp in out.outputs:
        check_failed(comp)
        choices.append(ChatChoice(
            index=comp.index, message=ChatResponseMessage(**plan.message(comp.text)),
            logprobs=_logprobs(state, comp.logprobs or []) if req.logprobs else None,
            finish_reason=plan.finish_reason(comp.text, comp.finish_reason), stop_reason=comp.stop_reason,
            token_ids=list(comp.token_ids) if req.return_token_ids else None))
    choices.sort(key=lambda c: c.index)
    return ChatCompletionResponse(id=request_id, model=state.served_model_name, choices=choices,
                                  usage=gen.usage(),
                                  prompt_token_ids=out.prompt_token_ids if req.return_token_ids else None)


def _stream(state: ServerState, req: ChatCompletionRequest, gen: Generation,
            request_id: str, plan: ToolPlan) -> AsyncIterator[str]:
    created = int(time.time())

    def body(choices: list[ChatStreamChoice], usage: Optional[Usage],
             prompt_ids: Optional[list[int]] = None) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=request_id, created=created, model=state.served_model_name,
                                            choices=choices, usage=usage, prompt_token_ids=prompt_ids)

    cursors = [ChoiceCursor() for _ in range(req.n)]
    streamers = [plan.streamer() for _ in range(req.n)]

    def choices_of(_p_idx: int, out: RequestOutput) -> list[ChatStreamChoice]:
        choices = []
        for comp, delta in new_deltas(out, cursors.__getitem__):
            streamer = streamers[comp.index]
            choices.append(ChatStreamChoice(
                index=comp.index, delta=DeltaMessage(**streamer.delta(delta.text, delta.done)),
                logprobs=_logprobs(state, delta.logprobs) if req.logprobs else None,
                finish_reason=streamer.finish_reason(comp.finish_reason) if delta.done else None,
                stop_reason=comp.stop_reason if delta.done else None,
                token_ids=delta.token_ids if req.return_token_ids else None))
        return choices

    roles = [ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
             for i in range(req.n)]
    prompt_ids = gen.items[0].prompt_ids if req.return_token_ids else None
    return stream_events(gen, req.stream_options, body, choices_of,
                         opening=lambda usage: body(roles, usage, prompt_ids))
