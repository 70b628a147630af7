"""The engine-side state of one sequence (one of a request's ``n`` completions).

Plain Python, no torch: the scheduler reasons only about these counters.

One counter drives everything: ``num_computed_tokens`` (positions whose target KV is valid) catches
up with ``len(token_ids) + len(draft_token_ids)``. A prefill chunk, a one-token decode and the
verification of k drafts are all "compute the tokens you have not computed yet".
"""

from __future__ import annotations

import enum
from typing import Any, Optional

from specserve.engine.types import FinishReason, RequestTimes, SamplingParams, SpecDecodeStats


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_FINISHED = RequestStatus.FINISHED


class Request:
    """One sequence: prompt, outputs, pending drafts, and where its KV lives."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 seed: int, eos_token_ids: tuple[int, ...], max_tokens: int, arrival: float,
                 parent_id: Optional[str] = None, index: int = 0):
        self.request_id = request_id
        self.parent_id = parent_id or request_id
        self.index = index                      # which of the parent's n completions
        self.params = params
        self.seed = seed
        self.eos_token_ids = eos_token_ids
        self.max_tokens = max_tokens            # resolved: never beyond the context window
        self.prompt_len = len(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + committed outputs
        self.status = RequestStatus.WAITING
        self.finish_reason: Optional[FinishReason] = None
        self.stop_reason: int | str | None = None
        self.error: Optional[str] = None

        self.num_computed_tokens = 0            # target KV valid for token_ids[:n] (+ drafts)
        self.num_draft_computed = 0             # draft-model KV valid for token_ids[:n]
        self.num_draft_kv_ahead = 0             # draft KV written past the committed tokens
        self.num_cached_tokens = 0              # prompt tokens served from the prefix cache
        self.block_ids: list[int] = []          # block table shared by the target and draft caches
        self.num_hashed_blocks = 0              # leading full blocks registered in the prefix cache
        self.block_hashes: list[int] = []       # hash chain of full committed blocks

        self.draft_token_ids: list[int] = []    # proposed, awaiting verification
        self.draft_probs: Any = None            # tensor [len(draft_token_ids), V] or None (greedy drafts)
        self.grammar: Any = None                # structured.GrammarState when the output is constrained
        # the parameters ask for logits processing (penalties, logit_bias, min_tokens): read by
        # runner.logits.needs_processing for every row of every step, so taken once here
        self.params_process_logits = bool(params.needs_penalties or params.logit_bias
                                          or params.min_tokens)

        self.spec_stats = SpecDecodeStats()
        self.times = RequestTimes(arrival=arrival)

    # ---- derived views -------------------------------------------------------------------
    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.prompt_len]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens_with_drafts(self) -> int:
        return len(self.token_ids) + len(self.draft_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens_with_drafts - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is _FINISHED   # (read several times a row every step: no enum lookup)

    def tokens_left(self, max_model_len: int) -> int:
        """Tokens it may still commit before max_tokens and the context end; at 0 it finishes
        on length."""
        n = len(self.token_ids)   # (every row, every step: no property calls)
        return min(self.max_tokens - n + self.prompt_len, max_model_len - n)

    def draft_room(self, max_model_len: int) -> int:
        """Drafts that would still fit before max_tokens and the context end, counted before any
        new token is committed (may be negative)."""
        return self.tokens_left(max_model_len) - 1

    def spec_budget(self, k: int, max_model_len: int, num_new: int = 0) -> int:
        """How many drafts this request may still take once ``num_new`` more tokens are committed:
        K shrinks near max_tokens and the context end."""
        return max(0, min(k, self.draft_room(max_model_len) - num_new))

    def clear_drafts(self) -> None:
        self.draft_token_ids = []
        self.draft_probs = None

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, drafts={len(self.draft_token_ids)}, "
                f"blocks={len(self.block_ids)})")
