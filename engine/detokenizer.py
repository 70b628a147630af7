"""Incremental detokenization with stop strings.

Text grows only by whole characters: a token that ends in the middle of a multi-byte UTF-8
character (byte-fallback or byte-level BPE) adds nothing until the character completes. Stop
strings are searched in the text as it grows (they may span tokens); while the tail of the text
could still become a stop string it is held back from ``visible_text``, so a stream never shows a
partial stop string.
"""

from __future__ import annotations

from typing import Optional

# prompt tokens decoded before the output so tokenizers that drop a leading space at the start
# of a sequence (SentencePiece's Metaspace) decode the first output token correctly
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str],
                 include_stop: bool, skip_special_tokens: bool):
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

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:  # the Rust tokenizer directly: no per-call Python conversion
            return self._backend.decode(ids, skip_special_tokens=self.skip_special)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int, check_stop: bool = True) -> Optional[str]:
        """Append one token; returns the stop string it completed, if any."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None  # an incomplete character (or nothing visible) so far
        old_len = len(self.text)
        self.text += full[len(prefix):]
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
