"""The draft model's side of a step: catch up on committed tokens, then propose k tokens.

After the target verified last step's drafts, each request's draft KV is valid for
``num_draft_computed + min(accepted, num_draft_kv_ahead)`` committed tokens. The first draft pass
feeds every request the committed tokens it has not seen (ragged: a prefill chunk, one token, or
two when all drafts were accepted) and samples draft 1 from the last position; passes 2..k feed
one token each. Draft j of a request is sampled with the RNG key of the output position it would
occupy, so a seeded request drafts the same tokens whatever the batch or a preemption.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from engine.batch import RequestResult, ScheduledRequest
from engine.request import Request
from engine.runner.inputs import ForwardItem
from engine.runner.logits import RowContext, apply_processors, needs_processing
from engine.runner.sampling_inputs import SamplingTensors
from engine.runner.transfer import to_device
from kernels import ops

# forward(items, input_ids=None) -> logits [sum(num_logits), V_target] of the draft model
DraftForward = Callable[[list[ForwardItem], Optional[torch.Tensor]], Optional[torch.Tensor]]


@dataclass
class _Proposal:
    request: Request
    committed: list[int]          # token ids after this step's accepted tokens
    k: int                        # drafts to propose
    drafts: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)


def propose(scheduled: list[ScheduledRequest], results: dict[str, RequestResult],
            forward: DraftForward, num_spec: int, max_model_len: int, store_probs: bool,
            greedy_drafts: bool, device: torch.device) -> None:
    """Fill ``results`` with new drafts and the draft model's KV progress for every request."""
    items: list[ForwardItem] = []
    proposals: list[_Proposal] = []
    for s in scheduled:
        req = s.request
        res = results.setdefault(req.request_id, RequestResult())
        if not s.samples:  # mid-prefill: keep the draft's KV level with the target's
            end = s.num_computed_before + s.num_new_tokens
            if end > req.num_draft_computed:
                items.append(ForwardItem(req.token_ids[req.num_draft_computed:end],
                                         req.num_draft_computed, req.block_ids, 0))
            res.num_draft_computed = max(end, req.num_draft_computed)
            continue
        accepted = res.sampled
        valid = req.num_draft_computed + min(len(accepted) - 1, req.num_draft_kv_ahead)
        committed = req.token_ids + accepted
        k = req.spec_budget(num_spec, max_model_len, num_new=len(accepted))
        if k == 0:
            res.num_draft_computed = valid
            continue
        if len(committed) - valid == 1 and valid > 0:
            valid -= 1  # re-feed one known token: every catch-up is 2 tokens, one CUDA graph serves all
        items.append(ForwardItem(committed[valid:], valid, req.block_ids, 1))
        proposals.append(_Proposal(req, committed, k))
    logits = forward(items, None) if items else None
    if proposals:
        _draft_passes(proposals, logits, forward, store_probs, greedy_drafts, device)
    for p in proposals:
        res = results[p.request.request_id]
        res.new_drafts = p.drafts
        res.new_draft_probs = torch.stack(p.probs) if p.probs else None   # [k, V]
        res.num_draft_computed = len(p.committed)
        res.num_draft_kv_ahead = p.k - 1


def _draft_passes(proposals: list[_Proposal], logits: torch.Tensor, forward: DraftForward,
                  store_probs: bool, greedy_drafts: bool, device: torch.device) -> None:
    """Passes 1..k. Drafts stay on the device between passes (fed back as the next input ids);
    the host reads them once at the end, unless a request's logits processors need the tokens."""
    host_each_pass = any(needs_processing(p.request) for p in proposals)
    max_k = max(p.k for p in proposals)
    table = None if host_each_pass else torch.full((len(proposals), max_k), -1, dtype=torch.int64,
                                                   device=device)  # [P, k]
    # sampling parameters of every proposal, copied once; pass j shifts the positions by j
    first_positions = [len(p.committed) - p.request.prompt_len for p in proposals]
    params = SamplingTensors.build([p.request for p in proposals], first_positions, device,
                                   force_greedy=greedy_drafts)
    prev: Optional[torch.Tensor] = None
    prev_rows: list[int] = []
    for j in range(max_k):
        rows = [i for i, p in enumerate(proposals) if p.k > j]
        active = [proposals[i] for i in rows]
        st = params if len(rows) == len(proposals) else params.rows(to_device(rows, torch.int64, device))
        if j > 0:
            items = [ForwardItem([p.drafts[-1] if host_each_pass else 0], len(p.committed) + j - 1,
                                 p.request.block_ids, 1) for p in active]
            ids = None
            if not host_each_pass:
                ids = prev if rows == prev_rows else prev[to_device(
                    [prev_rows.index(i) for i in rows], torch.int64, device)]
            logits = forward(items, ids)
        tokens, probs = _sample_pass(active, logits, st.shifted(j), store_probs)
        if host_each_pass:
            for p, tok in zip(active, tokens.tolist()):
                p.drafts.append(tok)
        elif len(rows) == len(proposals):
            table[:, j] = tokens
        else:
            table[to_device(rows, torch.int64, device), j] = tokens
        if store_probs:
            for i, p in enumerate(active):
                p.probs.append(probs[i])
        prev, prev_rows = tokens, rows
    if not host_each_pass:
        for p, row in zip(proposals, table.tolist()):  # the draft's one host read of the step
            p.drafts = row[:p.k]


def _sample_pass(active: list[_Proposal], logits: torch.Tensor, st: SamplingTensors,
                 store_probs: bool):
    """The next draft of each active proposal from ``logits [len(active), V]`` with its sampling
    parameters ``st`` (positions already those of this pass): (tokens [A], probs [A, V])."""
    if any(needs_processing(p.request) for p in active):
        apply_processors(logits, [RowContext(p.request, p.committed[p.request.prompt_len:] + p.drafts)
                                  for p in active])
    return ops.sample_draft(logits, st.temperature, st.top_k, st.top_p, st.min_p, st.seeds,
                            st.positions, store_probs)
