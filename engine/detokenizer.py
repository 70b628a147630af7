"""Incremental detokenization with stop strings.

Text grows only by whole characters: a token that ends in the middle of a multi-byte UTF-8
character (byte-fallback or byte-level BPE) adds nothing until the character completes. Stop
strings are searched in the text as it grows (they may span tokens); while the tail of the text
could still become a stop string it is held back from ``visible_text``, so a stream never shows a
partial stop string.

Byte-level BPE tokenizers (Qwen2/3, Llama 3, GPT-2; the decoder ``ByteLevel``) decode a sequence
as the UTF-8 of its tokens' bytes, one token after another, so once the text so far ends on a
whole character a token whose own bytes are whole characters adds exactly its own decoded piece.
Those tokens take a fast path: the piece, decoded once per token id and kept (``TokenPieces``),
instead of two decodes of the recent window. A token whose piece is not whole characters (a
byte of a multi-byte character, as random or CJK text often gives) takes a byte path: its raw
bytes (kept per token id too) join the bytes pending since the last visible text and are decoded
as the tokenizer decodes them (invalid sequences replaced, an incomplete character at the end
held back). Special and other added tokens (as the tokenizer had them when the engine started),
any other tokenizer, and a prompt that ends inside a character take the general path. Each
faster path gives the general path's text exactly (tests/unit/test_detokenizer.py). On the CPU
machine, random tokens of the test tokenizer (256 requests x 64 tokens) took 2.72-2.79 us a
token with the general path behind the fast one, 1.38-1.67 us with the byte path.
"""

from __future__ import annotations

from typing import Optional

# prompt tokens decoded before the output so tokenizers that drop a leading space at the start
# of a sequence (SentencePiece's Metaspace) decode the first output token correctly
_CONTEXT_TOKENS = 5


class TokenPieces:
    """Token id -> its decoded text alone, for tokenizers whose decoding is the concatenation of
    their tokens' (``context_free``); filled on first use of each id, shared by every request of
    an engine (one table per ``skip_special_tokens`` setting)."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None) if backend is not None else None
        self.context_free = type(decoder).__name__ == "ByteLevel"
        self._backend = backend
        self._tables: dict[bool, dict[int, Optional[str]]] = {False: {}, True: {}}
        self._raw: dict[int, Optional[bytes]] = {}
        self._added: frozenset[int] = frozenset()
        if self.context_free:
            self._added = frozenset(backend.get_added_tokens_decoder())

    def piece(self, token_id: int, skip_special_tokens: bool) -> Optional[str]:
        """The token's text if it is non-empty whole characters (None otherwise: general path)."""
        table = self._tables[skip_special_tokens]
        try:
            return table[token_id]
        except KeyError:
            text = self._backend.decode([token_id], skip_special_tokens=skip_special_tokens)
            piece = text if text and "\ufffd" not in text else None
            table[token_id] = piece
            return piece

    def raw(self, token_id: int) -> Optional[bytes]:
        """The token's bytes, as the byte-level decoder concatenates them (None for an added
        token, whose text is its content, and for an id the tokenizer does not know)."""
        try:
            return self._raw[token_id]
        except KeyError:
            raw = None
            if token_id not in self._added:
                token = self._backend.id_to_token(token_id)
                if token is not None:
                    try:
                        raw = bytes([_BYTE_OF_CHAR[c] for c in token])
                    except KeyError:   # not a byte-level token string
                        raw = None
            self._raw[token_id] = raw
            return raw


def _byte_level_chars() -> dict[str, int]:
    """The byte-level (GPT-2) alphabet: each of the 256 bytes is written as one printable
    character; bytes that are printable Latin-1 stand for themselves, the rest take the
    characters from U+0100 up, in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, shifted = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(0x100 + shifted)] = b
            shifted += 1
    return chars


_BYTE_OF_CHAR = _byte_level_chars()
_HOLD = object()   # the byte path's answer: bytes pending, nothing visible yet


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str],
                 include_stop: bool, skip_special_tokens: bool,
                 pieces: Optional[TokenPieces] = None):
        self.tokenizer = tokenizer
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special = skip_special_tokens
        self.max_stop_len = max((len(s) for s in stop), default=0)
        self.stopped = False
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pieces = pieces if pieces is not None and pieces.context_free else None
        # the raw bytes of ids[read_offset:] (None: take the general path until the next
        # visible text, from which on it is exact: a token without raw bytes is among them, or
        # the prompt's context ends inside a character, which the next bytes may complete)
        self._pending: Optional[bytearray] = None
        if self._pieces is not None and not (self.ids and self._decode(self.ids).endswith("\ufffd")):
            self._pending = bytearray()

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:  # the Rust tokenizer directly: no per-call Python conversion
            return self._backend.decode(ids, skip_special_tokens=self.skip_special)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int, check_stop: bool = True) -> Optional[str]:
        """Append one token; returns the stop string it completed, if any."""
        clean = self.read_offset == len(self.ids)   # no bytes pending since the last visible text
        self.ids.append(token_id)
        piece = None
        if self._pieces is not None:
            if clean:
                piece = self._pieces.piece(token_id, self.skip_special)
            if piece is None:
                piece = self._byte_piece(token_id)
                if piece is _HOLD:
                    return None
        if piece is None:
            prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
            full = self._decode(self.ids[self.prefix_offset:])
            if len(full) <= len(prefix) or full.endswith("\ufffd"):
                return None  # an incomplete character (or nothing visible) so far
            piece = full[len(prefix):]
        old_len = len(self.text)
        self.text += piece
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if self._pieces is not None:
            self._pending = bytearray()
        if not check_stop or not self.stop:
            return None
        return self._find_stop(max(0, old_len - self.max_stop_len + 1))

    def _byte_piece(self, token_id: int):
        """The byte path: the text the general path would add for ``token_id`` (a str), _HOLD
        where it would add nothing yet, or None (a token without raw bytes: take the general
        path). The pending bytes follow a visible text that ends on a whole character, so the
        general path's text past it is these bytes decoded as the tokenizer decodes (invalid
        sequences replaced by U+FFFD, one per maximal invalid subpart: Rust's
        ``from_utf8_lossy`` and Python's ``"replace"`` both follow Unicode's recommended
        practice), and it holds exactly where that text is empty or ends in U+FFFD (an
        incomplete character so far)."""
        pending = self._pending
        if pending is None:
            return None
        raw = self._pieces.raw(token_id)
        if raw is None:
            self._pending = None
            return None
        pending += raw
        text = pending.decode("utf-8", "replace")
        return text if text and not text.endswith("\ufffd") else _HOLD

    def _find_stop(self, search_from: int) -> Optional[str]:
        best: Optional[tuple[int, str]] = None
        for s in self.stop:
            i = self.text.find(s, search_from)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[:i + len(s)] if self.include_stop else self.text[:i]
        self.stopped = True
        return s

    def visible_text(self, finished: bool) -> str:
        """The text that is safe to show: without a tail that may still become a stop string."""
        if finished or self.stopped or not self.stop:
            return self.text
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return self.text[:len(self.text) - hold] if hold else self.text
