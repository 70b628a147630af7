"""POST /tokenize and /detokenize, in vLLM's shapes.

``/tokenize`` takes a ``prompt`` (tokenized as /v1/completions would, special tokens added by
default) or chat ``messages`` (rendered by the chat template as /v1/chat/completions would; the
template already holds the special tokens, so none are added by default) and returns
``{count, max_model_len, tokens}``: every token, also beyond max_model_len (clients count them to
decide what to cut). ``/detokenize`` turns token ids back into ``{prompt}``.
"""

from __future__ import annotations

from typing import Union

from specserve.server.errors import bad_request
from specserve.server.protocol import (DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest,
                                       TokenizeCompletionRequest, TokenizeResponse)
from specserve.server.prompt_text import check_text
from specserve.server.serving_chat import render_chat
from specserve.server.state import ServerState

TokenizeRequest = Union[TokenizeCompletionRequest, TokenizeChatRequest]


async def tokenize_request(state: ServerState, req: TokenizeRequest) -> TokenizeResponse:
    state.check_model(req.model)
    if isinstance(req, TokenizeChatRequest):
        if req.add_generation_prompt and req.continue_final_message:
            raise bad_request("add_generation_prompt and continue_final_message cannot both be true",
                              "continue_final_message")
        text, param = await render_chat(state, req), "messages"
    else:
        text, param = req.prompt, "prompt"
    check_text(text, param)
    ids = await state.preprocess.run(_all_ids, state.tokenizer, text, req.add_special_tokens)
    return TokenizeResponse(count=len(ids), max_model_len=state.engine.info.max_model_len, tokens=ids)


def _all_ids(tokenizer: object, text: str, add_special_tokens: bool) -> list[int]:
    """Every token id of ``text`` (a worker-thread job: /tokenize counts past max_model_len too)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])  # type: ignore[operator]


def detokenize_request(state: ServerState, req: DetokenizeRequest) -> DetokenizeResponse:
    state.check_model(req.model)
    vocab = state.engine.info.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "tokens")
    return DetokenizeResponse(prompt=state.tokenizer.decode(req.tokens, skip_special_tokens=False))
