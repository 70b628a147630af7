"""Per-row logits processing before sampling: penalties, logit_bias, min_tokens, grammar masks.

Applied identically to target rows (verification) and draft rows (proposal), each row with its
own context: row j of a verification sees the committed outputs plus drafts 1..j as generated
tokens, exactly as plain decoding would have at that position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.engine.request import Request
from specserve.engine.types import Logprob


@dataclass
class RowContext:
    """What one logits row needs to know about its request."""

    request: Request
    generated: list[int]      # output tokens before this row's position (incl. earlier drafts)


def needs_processing(req: Request) -> bool:
    return req.params_process_logits or req.grammar is not None


def _penalise(row: torch.Tensor, req: Request, generated: list[int]) -> None:
    p = req.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.prompt_token_ids) | set(generated)), dtype=torch.long,
                            device=row.device)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if generated and (p.presence_penalty or p.frequency_penalty):
        ids = torch.tensor(generated, dtype=torch.long, device=row.device)
        counts = torch.zeros(row.shape[0], dtype=torch.float32, device=row.device)
        counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))
        row -= (p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()).to(row.dtype)


def apply_processors(logits: torch.Tensor, rows: list[RowContext]) -> None:
    """In place on ``logits [len(rows), V]``; rows whose request needs nothing are untouched."""
    vocab = logits.shape[1]
    for i, ctx in enumerate(rows):
        req = ctx.request
        if not needs_processing(req):
            continue
        row = logits[i]
        p = req.params
        if p.needs_penalties:
            _penalise(row, req, ctx.generated)
        if p.logit_bias:
            ids = torch.tensor([t for t in p.logit_bias if 0 <= t < vocab], dtype=torch.long,
                               device=row.device)
            bias = torch.tensor([p.logit_bias[t] for t in p.logit_bias if 0 <= t < vocab],
                                dtype=row.dtype, device=row.device)
            row.index_add_(0, ids, bias)
        if len(ctx.generated) < p.min_tokens:
            eos = () if p.ignore_eos else req.eos_token_ids
            banned = [t for t in (*eos, *p.stop_token_ids) if 0 <= t < vocab]
            if banned:
                row[torch.tensor(banned, dtype=torch.long, device=row.device)] = float("-inf")
        if req.grammar is not None:   # the matcher state after this row's generated tokens
            req.grammar.mask_row(row, ctx.generated)


def logprobs_for(raw_rows: torch.Tensor, tokens: list[int], top_n: int) -> list[Logprob]:
    """Log-probabilities of ``tokens`` (one per row) under the model's own distribution.

    raw_rows: [len(tokens), V] unprocessed target logits.
    """
    lp = torch.log_softmax(raw_rows.float(), dim=-1)                      # [R, V]
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device).unsqueeze(1)).squeeze(1).tolist()
    out = []
    if top_n > 0:
        vals, ids = lp.topk(top_n, dim=-1)
        vals, ids = vals.tolist(), ids.tolist()
    for r, tok in enumerate(tokens):
        top = list(zip(ids[r], vals[r])) if top_n > 0 else []
        out.append(Logprob(token_id=tok, logprob=chosen[r], top=top))
    return out
