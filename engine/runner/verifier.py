"""Sampling and draft verification on the target's logits (one rejection-sampler call a step).

Plain decoding is the same call with zero drafts, so every request goes down one path. The
sampled tokens stay on the device after the call: when the draft program can start from them
(drafter.can_chain), the step's one host read brings them together with the new drafts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import torch

from specserve.engine.batch import RequestResult, ScheduledRequest
from specserve.engine.runner.logits import RowContext, apply_processors, logprobs_for, needs_processing
from specserve.engine.runner.sampling_inputs import SamplingTensors
from specserve.engine.runner.transfer import to_device
from specserve.kernels import ops


class MissingDraftProbsError(RuntimeError):
    """Drafts were proposed with probabilities but the rows are gone: never silently fall back."""


@dataclass
class Verification:
    """A launched rejection-sampler call: ``out`` [B, max_k + 1] (accepted drafts, then the
    recovered or bonus token, -1 padding) is still on the device; ``finish`` turns its rows,
    once read, into each request's result."""

    sampling: list[ScheduledRequest]
    out: torch.Tensor
    raw: dict          # request id -> unprocessed logits rows, for logprobs

    def finish(self, out_rows: list[list[int]]) -> dict[str, RequestResult]:
        results: dict[str, RequestResult] = {}
        one_column = bool(out_rows) and len(out_rows[0]) == 1   # no drafts: every row is [token]
        for row, s in zip(out_rows, self.sampling):
            tokens = row if one_column else [t for t in row if t >= 0]
            res = RequestResult(sampled=tokens)
            if s.request.params.logprobs is not None:
                res.logprobs = logprobs_for(self.raw[s.request.request_id][:len(tokens)], tokens,
                                            s.request.params.logprobs)
            results[s.request.request_id] = res
        return results


def start_verification(sampling: list[ScheduledRequest], logits: torch.Tensor, method: str,
                       draft_probs_expected: bool, device: torch.device,
                       output_offset: int = 0) -> Verification:
    """logits: [sum(k_b + 1), V] target rows, request by request (drafts then bonus row).
    ``output_offset``: tokens each request has sampled that its token list does not hold yet
    (a step launched before the previous one was read); its rows are sampled that many output
    positions further on. History-dependent logits processing needs the whole list (offset 0)."""
    reqs = [s.request for s in sampling]
    processing = any(needs_processing(r) for r in reqs)   # (once: this runs every step, every row)
    if output_offset and processing:
        raise ValueError("logits processors need every sampled token on the host")
    raw = _raw_rows_for_logprobs(sampling, logits)
    if processing:   # each row's history costs O(k x output length)
        rows: list[RowContext] = []
        for s in sampling:
            out = s.request.output_token_ids
            drafts = s.request.draft_token_ids[:s.k]
            rows.extend(RowContext(s.request, out + drafts[:j]) for j in range(s.k + 1))
        apply_processors(logits, rows)

    ks = [s.k for s in sampling]
    cu = to_device(list(itertools.accumulate(ks, initial=0)), torch.int32, device)
    draft_ids = to_device([t for s in sampling for t in s.request.draft_token_ids[:s.k]],
                          torch.int64, device)
    draft_probs = _gather_draft_probs(sampling) if draft_probs_expected and sum(ks) else None
    st = SamplingTensors.build(reqs, [r.num_output_tokens + output_offset for r in reqs], device)
    out = ops.rejection_sample(logits, cu, draft_ids, draft_probs, st.temperature, st.top_k,
                               st.top_p, st.min_p, st.seeds, st.positions, method, max(ks))
    return Verification(sampling, out, raw)


def _raw_rows_for_logprobs(sampling: list[ScheduledRequest], logits: torch.Tensor) -> dict:
    raw, row = {}, 0
    for s in sampling:
        n = s.k + 1
        if s.request.params.logprobs is not None:
            raw[s.request.request_id] = logits[row:row + n].clone()
        row += n
    return raw


def _gather_draft_probs(sampling: list[ScheduledRequest]) -> torch.Tensor:
    parts = []
    for s in sampling:
        if s.k == 0:
            continue
        probs = s.request.draft_probs
        if probs is None or probs.shape[0] < s.k:
            have = 0 if probs is None else probs.shape[0]
            raise MissingDraftProbsError(
                f"request {s.request.request_id}: {s.k} drafts to verify but {have} "
                "draft-probability rows stored")
        parts.append(probs[:s.k])
    joined = adjacent_rows(parts)
    return joined if joined is not None else torch.cat(parts, dim=0)  # [sum k, V]


def adjacent_rows(parts: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """``torch.cat(parts)`` as a view, when the parts are contiguous [k, V] rows lying one right
    after another in one storage (a batch drafted together and verified in the same order:
    runner/draft_loop.py copies its rows request-major); else None. At batch 256, k = 3 the
    concatenation copied 0.47 GB of fp32 rows a step (V = 151,936) and cost a slice per row on
    the host."""
    first = parts[0] if parts else None
    if first is None or first.dim() != 2 or not first.is_contiguous():
        return None
    storage, width, size = first.untyped_storage().data_ptr(), first.shape[1], first.element_size()
    end, rows = first.data_ptr() + first.numel() * size, first.shape[0]
    for p in parts[1:]:
        if (p.data_ptr() != end or p.dim() != 2 or p.shape[1] != width or p.dtype != first.dtype
                or not p.is_contiguous() or p.untyped_storage().data_ptr() != storage):
            return None
        end += p.numel() * size
        rows += p.shape[0]
    return first.as_strided((rows, width), (width, 1), first.storage_offset())
