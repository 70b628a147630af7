"""The sampling half of a step: verify what the target just scored, then propose the next drafts.

One ``Speculator`` owns this order for every request of the batch. Plain decoding is the same
path with zero drafts (and no ``Drafter``): one rejection-sampler call samples every request.
When the draft program can start from the sampler's output on the device
(``Drafter.can_chain``), the step's one host read brings the sampled tokens and the new drafts
together; otherwise the sampled tokens are read first and the drafts proposed after.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from specserve.engine.batch import RequestResult, ScheduledRequest
from specserve.engine.runner.drafter import Drafter
from specserve.engine.runner.host_read import HostRead
from specserve.engine.runner.phase_clock import PhaseClock
from specserve.engine.runner.settings import SpecSettings
from specserve.engine.runner.verifier import Verification, start_verification

Results = dict[str, RequestResult]
# the rest of a launched step: (ids dropped since) -> (results, draft start mark, draft end mark)
Finish = Callable[[set], tuple[Results, Any, Any]]


class Speculator:
    def __init__(self, settings: SpecSettings, drafter: Optional[Drafter], device: torch.device):
        self.settings, self.drafter, self.device = settings, drafter, device

    def launch(self, scheduled: list[ScheduledRequest], logits: Optional[torch.Tensor],
               clock: PhaseClock) -> tuple[Finish, Any]:
        """Queue what can run before the host reads anything: the sampler and, chained behind
        it, the draft program. Returns the rest of the step and the clock's mark where the
        target's part (forward and sampler) ends. The rest, called later with the ids of
        requests no longer in the step (aborted or preempted meanwhile: the host proposes
        nothing for them), reads the tokens and finishes the step: (results of every scheduled
        request, the marks where the draft's work started and ended, one mark twice without a
        draft). Until then the host is free for other work (the previous step's text and
        outputs, engine/core.py) while the device runs this step."""
        sampling = [s for s in scheduled if s.samples]
        drafter = self.drafter
        if not sampling:
            return (lambda dropped: self._propose(scheduled, {}, clock, dropped)), clock.mark()
        v = start_verification(sampling, logits, self.settings.rejection_method,
                               self.settings.store_probs, self.device)
        sampled = clock.mark()
        if drafter is not None and any(s.k_next for s in sampling) and drafter.can_chain(sampling):
            return self._chained(scheduled, v, clock, sampled), sampled
        return (lambda dropped: self._propose(scheduled, v.finish(v.out.tolist()), clock, dropped)), sampled

    def _propose(self, scheduled: list[ScheduledRequest], results: Results, clock: PhaseClock,
                 dropped: set) -> tuple[Results, Any, Any]:
        """Drafts proposed after the sampled tokens were read (``results``), if any are due,
        except for the requests in ``dropped``."""
        t1 = clock.mark()
        if dropped:
            scheduled = [s for s in scheduled if s.request.request_id not in dropped]
        drafter = self.drafter
        if drafter is None or nothing_to_draft(scheduled):
            return results, t1, t1
        drafter.propose(scheduled, results)
        return results, t1, clock.mark()

    def _chained(self, scheduled: list[ScheduledRequest], v: Verification, clock: PhaseClock,
                 sampled: Any) -> Finish:
        """The draft program starts behind the verification on the device (from the mark
        ``sampled``); one host read, of the sampled tokens and the drafts together, copied as
        soon as the program ends. Everything is queued at launch, so ``dropped`` changes
        nothing: their rows are read and left unused."""
        drafter = self.drafter
        results = drafter.chain(scheduled, v.out)
        t2 = clock.mark()
        width = v.out.shape[1]
        read = HostRead(torch.cat([v.out, drafter.loop.tokens[:len(v.sampling)]], 1))

        def finish(dropped: set) -> tuple[Results, Any, Any]:
            rows = read.rows()   # the step's one read
            results.update(v.finish([r[:width] for r in rows]))
            drafter.finish_chained(v.sampling, results, [r[width:] for r in rows])
            return results, sampled, t2
        return finish


def nothing_to_draft(scheduled: list[ScheduledRequest]) -> bool:
    """A step where the draft model has nothing to do: no prefill chunk for it to mirror
    (``draft_level``), no request may propose (k_next = 0) and none has draft KV ahead of its
    committed tokens to account for, so every request's draft-KV progress stays as it is."""
    return all((not s.k_next and not s.request.num_draft_kv_ahead) if s.samples else not s.draft_level
               for s in scheduled)

