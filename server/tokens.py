"""Text and bytes of single tokens, for the logprobs of both APIs (cached per token id), and the
logprob values as JSON can carry them."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

_HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; OpenAI clients expect a number


def clamp_logprob(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable character table (GPT-2 scheme).

    Printable Latin-1 bytes map to themselves; the other 68 bytes map, in order, to U+0100 onwards.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and "ByteLevel" in type(decoder).__name__ + repr(decoder)


class TokenText:
    """``text(id)`` is what the token decodes to on its own; ``bytes(id)`` its exact UTF-8 bytes.

    A token holding part of a multi-byte character decodes to U+FFFD on its own, so clients that
    need exact text join the ``bytes`` (the chat API's ``bytes`` field exists for that).
    """

    def __init__(self, tokenizer: Any, cache_size: int = 1 << 16):
        self._tok = tokenizer
        self._byte_level = _is_byte_level(tokenizer)
        self.text = lru_cache(maxsize=cache_size)(self._text)
        self.bytes = lru_cache(maxsize=cache_size)(self._bytes)

    def _text(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)

    def _bytes(self, token_id: int) -> list[int]:
        piece = self._tok.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            hex_byte = _HEX_BYTE.fullmatch(piece)
            if hex_byte:  # sentencepiece byte fallback, e.g. <0xE4>
                return [int(hex_byte.group(1), 16)]
            if self._byte_level and piece not in getattr(self._tok, "all_special_tokens", ()):
                table = _byte_level_decoder()
                if all(c in table for c in piece):
                    return [table[c] for c in piece]
        return list(self._text(token_id).encode("utf-8"))
