"""The contract between the scheduler and the model runner.

``SchedulerOutput`` says which requests compute how many tokens this step; ``ModelRunnerOutput``
says what came back (sampled tokens, new drafts, logprobs, how far the draft model got).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from specserve.engine.request import Request, RequestStatus
from specserve.engine.types import Logprob


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int          # tokens computed by the target this step, from num_computed_tokens
    num_computed_before: int
    samples: bool                # the chunk reaches the end: sample / verify this step
    k: int                       # drafts verified this step (0 unless samples)
    k_next: int                  # drafts the draft model may propose after this step
    num_accepted: int = 0        # of the k drafts, accepted (set by Scheduler.update_from_output)
    # a chunk that does not sample: whether the draft model's KV follows it this step. Adaptive k
    # at k = 0 leaves it behind (SpecControl.plan): the draft catches up on the prompt, priced,
    # in the step it drafts again, if it ever does
    draft_level: bool = True


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class RequestResult:
    """What the runner produced for one request this step."""

    sampled: list[int] = field(default_factory=list)      # accepted drafts + 1 recovered/bonus token
    logprobs: Optional[list[Logprob]] = None              # one per sampled token
    new_drafts: list[int] = field(default_factory=list)
    new_draft_probs: Any = None                          # tensor [len(new_drafts), V] or None
    num_draft_computed: Optional[int] = None              # draft KV now valid for token_ids[:n]
    num_draft_kv_ahead: int = 0                           # draft KV written beyond the committed tokens


@dataclass
class ModelRunnerOutput:
    results: dict[str, RequestResult] = field(default_factory=dict)
    target_seconds: float = 0.0        # target forward + verification (GPU time on CUDA)
    draft_seconds: float = 0.0         # the draft's catch-up and proposal
    # a step read after the next one was queued (decode-ahead, CUDA): seconds the host blocked
    # waiting for its tokens; the rest of the step's wall time is host work the GPU did not wait for
    host_wait_seconds: Optional[float] = None


def still_running(scheduled: list[ScheduledRequest]) -> list[ScheduledRequest]:
    """The entries of a step queued earlier whose requests still run: one finished, aborted or
    preempted since keeps nothing of the step (a preempted one samples those positions again,
    with the same Philox keys, when it resumes)."""
    running = RequestStatus.RUNNING   # (a local: an enum member's lookup costs more than the test)
    return [s for s in scheduled if s.request.status is running]
