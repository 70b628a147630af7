"""Prompt text in: Unicode checks and tokenization in the preprocessing pool."""

from __future__ import annotations

from specserve.server.errors import bad_request
from specserve.server.state import ServerState


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
