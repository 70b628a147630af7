"""Continuous batching over the paged KV cache (plain Python, no torch).

Each step every running request, then waiting ones, ask for the tokens they have not computed
yet (``Request.num_uncomputed``), within a per-step token budget. A prefill chunk, a decode and a
verification of k drafts are the same thing here. Two rules keep speculative decoding exact and
seeded requests reproducible whatever the batch:

* a chunk never ends inside a request's verification region (last committed token + drafts):
  the drafts are verified all at once or not yet, never truncated by the budget;
* when blocks run out the most recently admitted running request is preempted: its blocks are
  freed (its KV is recomputed later, partly from the prefix cache) while its drafts and their
  probabilities stay with it and are verified when it comes back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from specserve.engine.batch import ModelRunnerOutput, RequestResult, ScheduledRequest, SchedulerOutput
from specserve.engine.kv_cache import KVCacheManager
from specserve.engine.request import Request, RequestStatus
from specserve.engine.types import FinishReason, StepStats

# appends a request's sampled tokens (stop checks, detokenization); may call Scheduler.finish
TokenSink = Callable[[Request, RequestResult], None]


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_speculative_tokens: int = 0


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager):
        if limits.max_num_batched_tokens < limits.num_speculative_tokens + 1:
            raise ValueError("max_num_batched_tokens must be at least num_speculative_tokens + 1")
        self.limits = limits
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions_step = 0
        self.prefix_queries_step = 0   # prompt tokens looked up in the prefix cache this step
        self.prefix_hits_step = 0      # of which were found

    # ---- membership --------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish(self, req: Request, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        """Retire a request: free its blocks and drafts, whatever state it is in."""
        if req.is_finished:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._commit(req)   # its computed full blocks stay in the prefix cache, reusable
        self.kv.free(req)
        req.clear_drafts()
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
        self.requests.pop(req.request_id, None)

    # ---- one step --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.limits.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _chunk(self, req: Request, budget: int) -> int:
        """Tokens to compute for ``req`` within ``budget``, never splitting the verification region."""
        n = req.num_uncomputed
        if n <= budget:
            return n
        verify_start = req.num_tokens - 1
        if req.draft_token_ids and req.num_computed_tokens + budget > verify_start:
            return max(0, verify_start - req.num_computed_tokens)
        return budget

    def _slots_needed(self, req: Request, n: int) -> tuple[bool, int, int]:
        samples = req.num_computed_tokens + n == req.num_tokens_with_drafts
        k_next = 0
        if samples and self.limits.num_speculative_tokens:
            # after this step up to len(drafts) + 1 tokens are committed; the draft then proposes
            k_next = self.limits.num_speculative_tokens
        return samples, k_next, req.num_computed_tokens + n + k_next

    @staticmethod
    def _scheduled(req: Request, n: int, samples: bool, k_next: int) -> ScheduledRequest:
        """A step's entry for ``req``: all pending drafts are verified iff the chunk samples."""
        return ScheduledRequest(req, n, req.num_computed_tokens, samples,
                                len(req.draft_token_ids) if samples else 0, k_next)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget)
            if n <= 0:
                i += 1
                continue
            samples, k_next, slots = self._slots_needed(req, n)
            while not self.kv.allocate(req, slots):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue  # req preempted itself; the list shrank, i stays
            out.scheduled.append(self._scheduled(req, n, samples, k_next))
            budget -= n
            i += 1
        return budget

    @property
    def admission_due(self) -> bool:
        """A request waits and the batch has room for it: the next step should admit it."""
        return bool(self.waiting) and len(self.running) < self.limits.max_num_seqs

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while budget > 0 and self.admission_due:
            req = self.waiting[0]
            if not req.block_ids:
                cached = self.kv.claim_prefix(req)
                self.prefix_queries_step += req.num_tokens
                self.prefix_hits_step += cached
                req.num_computed_tokens = cached
                req.num_draft_computed = (self.kv.claimed_draft_tokens(req)
                                          if self.limits.num_speculative_tokens else cached)
                if req.times.num_preemptions == 0:   # a resumed request re-finds its own blocks
                    req.num_cached_tokens = cached
            n = self._chunk(req, budget)
            samples, k_next, slots = self._slots_needed(req, n)
            if n <= 0 or not self.kv.allocate(req, slots):
                # give back the prefix blocks it claimed: a waiting request must not hold KV
                self.kv.free(req)
                req.num_computed_tokens = req.num_draft_computed = 0
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(self._scheduled(req, n, samples, k_next))
            budget -= n

    # ---- committing a step's results -----------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput, stats: StepStats,
                           append_tokens: TokenSink) -> None:
        """Commit what the runner computed: each request's KV progress (rejected drafts rolled
        back), its acceptance (``ScheduledRequest.num_accepted``, the stats' counters), its sampled
        tokens (through ``append_tokens``, which may finish it) and its next drafts."""
        for s in so.scheduled:
            self._update_one(s, out.results.get(s.request.request_id), stats, append_tokens)

    def _update_one(self, s: ScheduledRequest, res: Optional[RequestResult], stats: StepStats,
                    append_tokens: TokenSink) -> None:
        req = s.request
        end = s.num_computed_before + s.num_new_tokens
        before = s.num_computed_before
        if before < req.prompt_len:   # a chunk of the prompt (decode rows are past it)
            stats.num_prompt_tokens += min(end, req.prompt_len) - before
        req.num_computed_tokens = end
        if res is not None and res.num_draft_computed is not None:
            req.num_draft_computed = res.num_draft_computed
            req.num_draft_kv_ahead = res.num_draft_kv_ahead
        if not s.samples:
            self._commit(req)
            return
        assert res is not None and res.sampled, f"{req.request_id}: no sampled token"
        s.num_accepted = len(res.sampled) - 1
        if s.k:   # a row with no drafts sampled exactly one token: nothing to roll back or count
            req.num_computed_tokens -= s.k - s.num_accepted   # roll back rejected drafts' KV
            req.spec_stats.record(s.k, s.num_accepted)
            stats.spec_decode.record(s.k, s.num_accepted)
        req.clear_drafts()
        append_tokens(req, res)   # a finish there commits the blocks before freeing them
        if req.is_finished:
            return
        if res.new_drafts:
            req.draft_token_ids = res.new_drafts
            req.draft_probs = res.new_draft_probs
        self._commit(req)

    def _commit(self, req: Request) -> None:
        """Register full blocks of committed tokens whose target KV is computed, noting how far
        the draft model's KV (if there is a draft model) is written too."""
        draft = req.num_draft_computed if self.limits.num_speculative_tokens else None
        self.kv.commit(req, req.num_computed_tokens, draft)

    def _preempt(self, req: Request) -> None:
        """Free the request's KV (both models) and queue it first; drafts and their probs survive
        (copied to storage of their own: the draft loop hands out views of one batch-wide copy,
        which a request waiting in the queue would otherwise keep alive whole)."""
        probs = req.draft_probs
        if probs is not None and probs.untyped_storage().nbytes() > probs.numel() * probs.element_size():
            req.draft_probs = probs.clone()
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_draft_computed = 0
        req.num_draft_kv_ahead = 0
        req.status = RequestStatus.WAITING
        req.times.num_preemptions += 1
        self.num_preemptions_step += 1
        self.waiting.appendleft(req)

    def pop_prefix_counts(self) -> tuple[int, int]:
        out = (self.prefix_queries_step, self.prefix_hits_step)
        self.prefix_queries_step = self.prefix_hits_step = 0
        return out

    def pop_preemption_count(self) -> int:
        n, self.num_preemptions_step = self.num_preemptions_step, 0
        return n

    def capacity_error(self, num_slots: int) -> Optional[str]:
        """Why a request needing ``num_slots`` positions can never run, or None if it can."""
        need = self.kv.blocks_for(num_slots)
        if need > self.kv.num_blocks:
            return (f"this request needs up to {num_slots} KV slots ({need} blocks of "
                    f"{self.kv.block_size}) but the whole KV cache holds "
                    f"{self.kv.num_blocks * self.kv.block_size} tokens")
        return None
