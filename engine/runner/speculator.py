"""The sampling half of a step: verify what the target just scored, then propose the next drafts.

One ``Speculator`` owns this order for every request of the batch. Plain decoding is the same
path with zero drafts (and no ``Drafter``): one rejection-sampler call samples every request.
When the draft program can start from the sampler's output on the device
(``Drafter.can_chain``), the step's one host read brings the sampled tokens and the new drafts
together; otherwise the sampled tokens are read first and the drafts proposed after.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from specserve.engine.batch import RequestResult, ScheduledRequest
from specserve.engine.runner.drafter import Drafter
from specserve.engine.runner.phase_clock import PhaseClock
from specserve.engine.runner.settings import SpecSettings
from specserve.engine.runner.verifier import Verification, start_verification

Results = dict[str, RequestResult]


class Speculator:
    def __init__(self, settings: SpecSettings, drafter: Optional[Drafter], device: torch.device):
        self.settings, self.drafter, self.device = settings, drafter, device

    def step(self, scheduled: list[ScheduledRequest], logits: Optional[torch.Tensor],
             clock: PhaseClock) -> tuple[Results, Any, Any]:
        """Results of every scheduled request, with the clock marks where the draft's work
        started and ended (the same mark twice without a draft)."""
        sampling = [s for s in scheduled if s.samples]
        results: Results = {}
        drafter = self.drafter
        if sampling:
            v = start_verification(sampling, logits, self.settings.rejection_method,
                                   self.settings.store_probs, self.device)
            if drafter is not None and any(s.k_next for s in sampling) and drafter.can_chain(sampling):
                return self._chained(scheduled, v, clock)
            results = v.finish(v.out.tolist())   # the target's read; the drafts are read later
        t1 = clock.mark()
        if drafter is None or nothing_to_draft(scheduled):
            return results, t1, t1
        drafter.propose(scheduled, results)
        return results, t1, clock.mark()

    def _chained(self, scheduled: list[ScheduledRequest], v: Verification,
                 clock: PhaseClock) -> tuple[Results, Any, Any]:
        """The draft program starts behind the verification on the device; one host read."""
        drafter = self.drafter
        t1 = clock.mark()
        results = drafter.chain(scheduled, v.out)
        t2 = clock.mark()
        width = v.out.shape[1]
        rows = torch.cat([v.out, drafter.loop.tokens[:len(v.sampling)]], 1).tolist()  # the one read
        results.update(v.finish([r[:width] for r in rows]))
        drafter.finish_chained(v.sampling, results, [r[width:] for r in rows])
        return results, t1, t2


def nothing_to_draft(scheduled: list[ScheduledRequest]) -> bool:
    """A step where the draft model has nothing to do: no prefill chunk for it to mirror
    (``draft_level``), no request may propose (k_next = 0) and none has draft KV ahead of its
    committed tokens to account for, so every request's draft-KV progress stays as it is."""
    return all((not s.k_next and not s.request.num_draft_kv_ahead) if s.samples else not s.draft_level
               for s in scheduled)

