"""Decoding one step ahead: the GPU runs step N + 1 while the host commits step N.

Without it every step ends with the host reading the sampled tokens, then committing them
(stop checks, detokenization, outputs) and scheduling and preparing the next step while the GPU
waits: 0.5 ms of a 6.4 ms batch-1 step of an 8B model on an H100, 1.2 ms of 7.9 ms at batch 16.

With it, once a plain sampling step N is queued, the next step is queued behind it before N's
tokens are read. The scheduler does not run for that step: it is N's *continuation*, in which
every request of N that can still generate decodes the one token N sampled for it. Its input
ids are gathered from N's sampler output on the device, its positions and KV slots are known
(one past N's), and its sampling positions are one output further on, so the Philox key of
every sampled token is what a synchronous engine uses: output is unchanged, seeded or greedy.

A request that N finishes (end of sequence, stop string, abort) has a row in N + 1 that is
computed and dropped; N + 1 writes its KV only at the position past everything the request
committed, in a block it alone holds, and before any later step can reuse that block.

The continuation is queued only when the scheduler would have scheduled exactly it:

* every request of N sampled one token and nothing was drafted: a plain engine, or one with a
  draft model whose adaptive k is at k = 0. Its plan for N + 1 (it reads no tokens) is made
  before N is read; if it picks k > 0, N + 1 is not queued then but as soon as N's tokens
  are committed (``EngineCore._queue_next``), as planned. Tensor parallelism reads tokens on
  the host, so it is excluded;
* no request needs its full token history on the host for its logits (penalties, logit bias,
  min_tokens, a grammar) or asks for logprobs (read on the host when the step is collected);
* no waiting request could be admitted (the queue is empty or the batch is full);
* the KV pool has the blocks for one more position of each request.

Otherwise the step is collected first and the scheduler plans the next one as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from specserve.engine.batch import SchedulerOutput, ScheduledRequest, still_running
from specserve.engine.runner.logits import needs_processing
from specserve.engine.runner.speculator import nothing_to_draft
from specserve.engine.scheduler import Scheduler

if TYPE_CHECKING:
    from specserve.engine.runner.launched import LaunchedDecode
    from specserve.engine.runner.model_runner import ModelRunner
    from specserve.engine.spec_control import SpecControl


class DecodeAhead:
    """Owns the step queued ahead: whether a scheduled step may run ahead, and its continuation."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, max_model_len: int,
                 spec_control: Optional[SpecControl] = None):
        self.runner, self.scheduler, self.max_model_len = runner, scheduler, max_model_len
        self.spec_control = spec_control   # SpecControl with a draft model, else None
        self.pending: Optional[tuple[SchedulerOutput, Optional[LaunchedDecode]]] = None
        self.num_ahead_steps = 0     # continuations queued on the device (tests, the bench)
        self.num_planned_steps = 0   # continuations planned with drafts, run after the read

    @staticmethod
    def supported(runner: ModelRunner) -> bool:
        """One device: tensor-parallel ranks read the token ids on the host."""
        return runner.tp is None

    @staticmethod
    def can_launch(so: SchedulerOutput) -> bool:
        """Every scheduled request samples one token and the draft model (if any) has nothing to
        do: no drafts verified or proposed, no draft KV ahead to account for. Such a step's
        tokens can be read later."""
        return (not so.is_empty and all(s.samples and s.k == 0 for s in so.scheduled)
                and nothing_to_draft(so.scheduled))

    def launch(self, so: SchedulerOutput) -> LaunchedDecode:
        return self.runner.launch_decode(so.scheduled)

    def take(self) -> Optional[tuple[SchedulerOutput, Optional[LaunchedDecode]]]:
        """The step the last ``launch_next`` planned (queued on the device, or None: to run
        now), with its requests that still run: one that
        finished, was aborted or was preempted since keeps nothing of it (a preempted one
        samples that position again, with the same Philox key, when it resumes; the scheduler
        never preempts while a step is queued, tests do). None when no request is left: the
        step is dropped unread."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        so, launched = pending
        live = still_running(so.scheduled)
        if not live:
            return None
        return SchedulerOutput(live), launched

    def launch_next(self, so: SchedulerOutput, launched: LaunchedDecode) -> None:
        """Plan ``launched``'s continuation, if the scheduler would have scheduled just that,
        and queue it on the device unless adaptive k chose to draft after it: then it waits,
        planned, until this step's tokens are committed (``take_planned``)."""
        scheduled = self._continuation(so)
        if not scheduled:
            return
        cont = SchedulerOutput(scheduled)
        if any(s.k_next for s in scheduled):
            self.pending = (cont, None)
            self.num_planned_steps += 1
            return
        self.pending = (cont, self.runner.launch_decode(scheduled, after=launched))
        self.num_ahead_steps += 1

    def take_planned(self) -> Optional[SchedulerOutput]:
        """The continuation ``launch_next`` planned with drafts (not queued on the device), with
        its requests still running, for the engine to queue now; None (and the pending step kept)
        when the continuation is on the device already."""
        if self.pending is None or self.pending[1] is not None:
            return None
        so, _ = self.pending
        self.pending = None
        live = still_running(so.scheduled)
        return SchedulerOutput(live) if live else None

    def drop(self) -> None:
        self.pending = None

    def _continuation(self, so: SchedulerOutput) -> Optional[list[ScheduledRequest]]:
        sched = self.scheduler
        if sched.admission_due:
            return None   # the scheduler plans the next step
        spec = self.spec_control
        # with a draft model only adaptive k at k = 0 continues: no drafts pending, no draft KV
        # ahead (checked per row below); the plan may still pick k > 0 for the next step
        # (``launch_next``)
        if spec is not None and not spec.at_zero:
            return None
        drafts_possible = spec is not None
        max_len = self.max_model_len
        out = []
        for s in so.scheduled:   # all running: fresh from the scheduler or from ``take``
            req = s.request
            # logits processors read the whole history; logprobs are read on the host when the
            # step is collected, which would wait for the step queued behind it anyway
            if req.grammar is not None or needs_processing(req) or req.params.logprobs is not None:
                return None
            if req.tokens_left(max_len) <= 1:
                continue   # this step's token is its last (finishes on length): no row for it
            if drafts_possible and (req.num_draft_kv_ahead or req.draft_token_ids):
                return None
            pos = s.num_computed_before + s.num_new_tokens   # the token this step samples
            out.append(ScheduledRequest(req, num_new_tokens=1, num_computed_before=pos, samples=True,
                                        k=0, k_next=0))
        if not out:
            return None
        # KV slots past each request's position: its token, plus drafts it may propose
        room = 1 + (spec.k_max if spec is not None else 0)
        kv = sched.kv
        if not kv.fits((s.request, s.num_computed_before + room) for s in out):
            return None   # the scheduler decides who is preempted
        if spec is not None:
            # as the scheduler's path would, before the token is read
            spec.plan(out, unread=1, waiting=len(sched.waiting))
        for s in out:
            kv.allocate(s.request, s.num_computed_before + 1 + s.k_next)
        return out
