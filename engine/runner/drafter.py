"""The draft model's side of a step: catch up on committed tokens, then propose k tokens.

After the target verified last step's drafts, each request's draft KV is valid for
``num_draft_computed + min(accepted, num_draft_kv_ahead)`` committed tokens. The first draft pass
feeds every request the committed tokens it has not seen, always at least two (one known token is
re-fed when only one is new), and samples draft 1 from the last position; passes 2..k feed one
token each. Normally all of it runs as one device program (draft_loop.py): tokens beyond the last
two are fed first in a KV-only forward, together with the mid-prefill requests' chunks. Draft j
of a request is sampled with the RNG key of the output position it would occupy, so a seeded
request drafts the same tokens whatever the batch or a preemption.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from specserve.engine.batch import RequestResult, ScheduledRequest
from specserve.engine.request import Request
from specserve.engine.runner.draft_loop import DraftLoop, LoopRow
from specserve.engine.runner.inputs import ForwardItem
from specserve.engine.runner.logits import RowContext, apply_processors, needs_processing
from specserve.engine.runner.sampling_inputs import SamplingTensors
from specserve.engine.runner.settings import SpecSettings
from specserve.engine.runner.transfer import to_device
from specserve.kernels import ops

# forward(items) -> logits [sum(num_logits), V_target] of the draft model (None: no logits rows)
DraftForward = Callable[[list[ForwardItem]], Optional[torch.Tensor]]


@dataclass
class _Proposal:
    request: Request
    committed: list[int]          # token ids after this step's accepted tokens
    valid: int                    # committed tokens whose draft KV is valid
    k: int                        # drafts to propose
    drafts: list[int] = field(default_factory=list)
    probs: Optional[torch.Tensor] = None     # [k, V] fp32 when probabilities are stored


class Drafter:
    """The draft model's proposals for one step: ``forward`` is the draft model's forward over
    ragged items, ``loop`` its device program (None: every pass runs on the host)."""

    def __init__(self, forward: DraftForward, loop: Optional[DraftLoop], settings: SpecSettings,
                 device: torch.device):
        self.forward, self.loop, self.settings, self.device = forward, loop, settings, device

    # ---- proposals after the host read -------------------------------------------------------
    def propose(self, scheduled: list[ScheduledRequest], results: dict[str, RequestResult]) -> None:
        """Fill ``results`` with new drafts and the draft model's KV progress for every request.

        Proposals run as the device program unless a request's logits processors need each
        pass's tokens on the host (then: one forward, sample and read per pass)."""
        kv_only: list[ForwardItem] = []   # runs whose draft KV is needed but not their logits
        proposals: list[_Proposal] = []
        for s in scheduled:
            req = s.request
            res = results.setdefault(req.request_id, RequestResult())
            if not s.samples:
                if s.draft_level:
                    _keep_level(s, res, kv_only)
                continue
            accepted = res.sampled
            valid = _draft_kv_valid(req, len(accepted))
            k = self.settings.budget(req, s.k_next, len(accepted)) if s.k_next else 0
            if k == 0:
                res.num_draft_computed = valid
                continue
            committed = req.token_ids + accepted
            if len(committed) - valid == 1 and valid > 0:
                valid -= 1  # re-feed one known token: every catch-up is 2 tokens, as the loop expects
            proposals.append(_Proposal(req, committed, valid, k))
        loop = self.loop
        if loop is not None and loop.fits(len(proposals)) and not any(
                needs_processing(p.request) for p in proposals):
            self._device_passes(proposals, kv_only)
        else:
            self._host_passes(proposals, kv_only)
        for p in proposals:
            res = results[p.request.request_id]
            res.new_drafts = p.drafts
            res.new_draft_probs = p.probs
            res.num_draft_computed = len(p.committed)
            res.num_draft_kv_ahead = p.k - 1

    def _device_passes(self, proposals: list[_Proposal], kv_only: list[ForwardItem]) -> None:
        """Catch-ups longer than 2 tokens (the first proposal after a prefill) feed their head in
        the KV-only forward; the loop then runs every proposal from its last two committed
        tokens."""
        rows = []
        for p in proposals:
            n = len(p.committed)
            assert n - p.valid >= 2, "the draft KV cannot be ahead of the committed tokens"
            if n - p.valid > 2:
                kv_only.append(ForwardItem(p.committed[p.valid:n - 2], p.valid, p.request.block_ids, 0))
            rows.append(LoopRow(p.request, p.committed[n - 2:], n - 2, p.k, n - p.request.prompt_len))
        if kv_only:
            self.forward(kv_only)
        if not rows:
            return
        drafts, probs = self.loop.run(rows)
        for p, d, q in zip(proposals, drafts, probs):
            p.drafts, p.probs = d, q

    def _host_passes(self, proposals: list[_Proposal], kv_only: list[ForwardItem]) -> None:
        """Passes 1..k with a host read after each: logits processors need the drafts so far."""
        store_probs, device = self.settings.store_probs, self.device
        items = kv_only + [ForwardItem(p.committed[p.valid:], p.valid, p.request.block_ids, 1)
                           for p in proposals]
        logits = self.forward(items) if items else None
        if not proposals:
            return
        # sampling parameters of every proposal, copied once; pass j shifts the positions by j
        first_positions = [len(p.committed) - p.request.prompt_len for p in proposals]
        params = SamplingTensors.build([p.request for p in proposals], first_positions, device,
                                       force_greedy=self.settings.greedy_drafts)
        probs_of: list[list[torch.Tensor]] = [[] for _ in proposals]
        for j in range(max(p.k for p in proposals)):
            rows = [i for i, p in enumerate(proposals) if p.k > j]
            active = [proposals[i] for i in rows]
            st = params if len(rows) == len(proposals) else params.rows(to_device(rows, torch.int64, device))
            if j > 0:
                logits = self.forward([ForwardItem([p.drafts[-1]], len(p.committed) + j - 1,
                                                   p.request.block_ids, 1) for p in active])
            tokens, probs = _sample_pass(active, logits, st.shifted(j), store_probs,
                                         self.settings.draft_stream)
            for a, (i, tok) in enumerate(zip(rows, tokens.tolist())):
                proposals[i].drafts.append(tok)
                if store_probs:
                    probs_of[i].append(probs[a])
        if store_probs:
            for p, q in zip(proposals, probs_of):
                p.probs = torch.stack(q)

    # ---- proposals chained to the verification on the device -----------------------------------
    def can_chain(self, sampling: list[ScheduledRequest]) -> bool:
        """Whether the draft program can start from the verification output before the host
        reads it, so that one read brings both the sampled tokens and the new drafts. Every
        sampling request must know its catch-up without the accepted tokens: its draft KV covers
        all committed tokens, or it verifies no drafts (one new token; a first proposal after a
        prefill). Logits processors need the host between passes."""
        if self.loop is None or not self.loop.fits(len(sampling)):
            return False
        for s in sampling:
            req = s.request
            in_step = req.num_draft_computed == req.num_tokens and s.k <= req.num_draft_kv_ahead + 1
            fresh = s.k == 0 and req.num_draft_computed < req.num_tokens
            if needs_processing(req) or not (in_step or fresh):
                return False
        return True

    def chain(self, scheduled: list[ScheduledRequest], verified: torch.Tensor) -> dict[str, RequestResult]:
        """Launch this step's draft work behind the verification (``verified`` [B, w] on the
        device, rows in the order of the sampling requests); returns the results of the
        requests still prefilling. Committed tokens beyond the catch-up (known before
        verification) are fed first, in a KV-only forward with the prefill chunks. A request
        allowed no drafts this step (``k_next`` 0) rides along without writing KV: its draft KV
        falls behind and catches up in the step it drafts again."""
        loop = self.loop
        results: dict[str, RequestResult] = {}
        kv_only: list[ForwardItem] = []
        sampling: list[Request] = []
        caps: list[int] = []
        for s in scheduled:
            req = s.request
            if not s.samples:
                if s.draft_level:
                    _keep_level(s, results.setdefault(req.request_id, RequestResult()), kv_only)
                continue
            sampling.append(req)
            caps.append(min(loop.k_max, s.k_next))
            if caps[-1] and req.num_draft_computed < req.num_tokens - 1:
                kv_only.append(ForwardItem(req.token_ids[req.num_draft_computed:req.num_tokens - 1],
                                           req.num_draft_computed, req.block_ids, 0))
        if kv_only:
            self.forward(kv_only)
        loop.launch_chained(sampling, verified, self.settings.max_model_len, caps)
        return results

    def finish_chained(self, sampling: list[ScheduledRequest], results: dict[str, RequestResult],
                       table: list[list[int]]) -> None:
        """Fill in the drafts of a chained step once ``table`` (the program's [B, k] tokens) and
        the sampled tokens in ``results`` have been read; the program proposed ``budget``
        drafts per request, computed on the device from the same numbers."""
        ks = [self.settings.budget(s.request, s.k_next, len(results[s.request.request_id].sampled))
              for s in sampling]
        drafts, probs = self.loop.collect(table, ks)
        for s, k, d, q in zip(sampling, ks, drafts, probs):
            req = s.request
            res = results[req.request_id]
            n = len(res.sampled)
            if k == 0:
                res.num_draft_computed = _draft_kv_valid(req, n)
                continue
            res.new_drafts, res.new_draft_probs = d, q
            res.num_draft_computed = req.num_tokens + n
            res.num_draft_kv_ahead = k - 1


def _draft_kv_valid(req: Request, num_new: int) -> int:
    """Committed tokens whose draft KV is valid once ``num_new`` tokens (accepted drafts and one
    more) are committed: the draft wrote KV for its first drafts, valid as far as they were
    accepted."""
    return req.num_draft_computed + min(num_new - 1, req.num_draft_kv_ahead)


def _keep_level(s: ScheduledRequest, res: RequestResult, kv_only: list[ForwardItem]) -> None:
    """A request still prefilling: keep the draft's KV level with the target's."""
    req = s.request
    end = s.num_computed_before + s.num_new_tokens
    if end > req.num_draft_computed:
        kv_only.append(ForwardItem(req.token_ids[req.num_draft_computed:end],
                                   req.num_draft_computed, req.block_ids, 0))
    res.num_draft_computed = max(end, req.num_draft_computed)


def _sample_pass(active: list[_Proposal], logits: torch.Tensor, st: SamplingTensors,
                 store_probs: bool, stream: int):
    """The next draft of each active proposal from ``logits [len(active), V]`` with its sampling
    parameters ``st`` (positions already those of this pass): (tokens [A], probs [A, V])."""
    if any(needs_processing(p.request) for p in active):
        apply_processors(logits, [RowContext(p.request, p.committed[p.request.prompt_len:] + p.drafts)
                                  for p in active])
    return ops.sample_draft(logits, st.temperature, st.top_k, st.top_p, st.min_p, st.seeds,
                            st.positions, store_probs, stream=stream)
