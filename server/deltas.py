"""What a stream has already sent of each choice, and what the next chunk sends of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from specserve.engine.types import CompletionOutput, Logprob, RequestOutput
from specserve.server.generation import check_failed


@dataclass(frozen=True)
class Delta:
    """The unsent part of one choice: new text, token ids and logprobs."""

    text: str
    token_ids: list[int]
    logprobs: list[Logprob]
    first: bool  # nothing of this choice was sent before
    done: bool   # the choice has finished: this is its last delta


@dataclass
class ChoiceCursor:
    """How much of one choice's cumulative text / tokens / logprobs a stream has already sent."""

    text: int = 0
    tokens: int = 0
    logprobs: int = 0
    done: bool = False

    def advance(self, comp: CompletionOutput) -> Delta:
        """The unsent parts of ``comp``; marks them sent."""
        first = self.tokens == 0 and self.text == 0
        text, self.text = comp.text[self.text:], len(comp.text)
        ids, self.tokens = comp.token_ids[self.tokens:], len(comp.token_ids)
        all_lps = comp.logprobs or []
        lps, self.logprobs = all_lps[self.logprobs:], len(all_lps)
        self.done = comp.finish_reason is not None
        return Delta(text, ids, lps, first, self.done)


def new_deltas(out: RequestOutput, cursor_of: Callable[[int], ChoiceCursor]
               ) -> Iterator[tuple[CompletionOutput, Delta]]:
    """(choice, its delta) for each choice of ``out`` with something unsent (text, tokens or its
    end); ``cursor_of(choice index)`` keeps the choice's progress. A failed choice raises."""
    for comp in out.outputs:
        check_failed(comp)
        cursor = cursor_of(comp.index)
        if cursor.done:
            continue
        delta = cursor.advance(comp)
        if delta.text or delta.token_ids or delta.done:
            yield comp, delta
