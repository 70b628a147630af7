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
instead of two decodes of the recent window. Any other tokenizer, a token whose piece is not
whole characters, and every token after one that left bytes pending take the general path.
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
        if clean and self._pieces is not None:
            piece = self._pieces.piece(token_id, self.skip_special)
        if piece is None:
            prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
            full = self._decode(self.ids[self.prefix_offset:])
            if len(full) <= len(prefix) or full.endswith("\ufffd"):
                return None  # an incomplete character (or nothing visible) so far
            piece = full[len(prefix):]
        old_len = len(self.text)
        self.text += piece
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if not check_stop or not self.stop:
            return None
        return self._find_stop(max(0, old_len - self.max_stop_len + 1))

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
