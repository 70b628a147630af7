"""Shared inputs for the sampling kernel tests (no tests here).

``make_verify_case`` builds a ragged verification batch the way the engine does: draft logits
close to the target's, draft tokens and q from the reference ``sample_draft`` (stream DRAFT), so
that drafts are often accepted. ``chi2_pvalue`` is the chi-square goodness-of-fit p-value used by
the statistical tests (torch only, no scipy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

# (temperature, top_k, top_p, min_p): plain, each filter alone, all filters, greedy
PARAM_SETS = {
    "t1": (1.0, 0, 1.0, 0.0),
    "t0.6_topk4": (0.6, 4, 1.0, 0.0),
    "t1.4_topp0.8": (1.4, 0, 0.8, 0.0),
    "t1_minp0.1": (1.0, 0, 1.0, 0.1),
    "t0.8_all": (0.8, 6, 0.9, 0.05),
}
GREEDY = (0.0, 0, 1.0, 0.0)


@dataclass
class VerifyCase:
    target_logits: torch.Tensor        # [sum k + B, V]
    cu: torch.Tensor                   # [B + 1] int32
    drafts: torch.Tensor               # [sum k] int64
    q: Optional[torch.Tensor]          # [sum k, V] fp32 (None: one-hot drafts)
    temperature: torch.Tensor          # [B] f32
    top_k: torch.Tensor                # [B] i32
    top_p: torch.Tensor                # [B] f32
    min_p: torch.Tensor                # [B] f32
    seeds: torch.Tensor                # [B] i64
    positions: torch.Tensor            # [B] i64

    def args(self, method: str) -> tuple:
        return (self.target_logits, self.cu, self.drafts, self.q, self.temperature, self.top_k,
                self.top_p, self.min_p, self.seeds, self.positions, method)

    def to(self, device: str) -> "VerifyCase":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                 for k, v in self.__dict__.items()}
        return VerifyCase(**moved)


def param_tensors(params: list[tuple]) -> tuple[torch.Tensor, ...]:
    t, k, p, m = zip(*params)
    return (torch.tensor(t, dtype=torch.float32), torch.tensor(k, dtype=torch.int32),
            torch.tensor(p, dtype=torch.float32), torch.tensor(m, dtype=torch.float32))


def make_verify_case(ks: list[int], params: list[tuple], vocab: int, seed: int,
                     dtype: torch.dtype = torch.float32, noise: float = 0.5,
                     one_hot: bool = False, greedy_drafts: bool = False,
                     masked_tail: int = 0, scale: float = 2.0,
                     device: str = "cpu") -> VerifyCase:
    """A ragged batch: request b has ks[b] drafts and sampling params params[b].

    ``masked_tail`` sets the last logits of every row to -inf (vocabulary padding).
    ``greedy_drafts``: drafts are the draft logits' argmax (draft_sample_method=greedy).
    Built on ``device`` (random logits from a generator there; drafts from the reference).
    """
    from specserve.kernels import ref_sampling as R

    gen = torch.Generator().manual_seed(seed)
    dgen = torch.Generator(device=device).manual_seed(seed)
    b = len(ks)
    cu = torch.tensor([0] + list(torch.tensor(ks).cumsum(0).tolist()), dtype=torch.int32)
    rows = int(cu[-1]) + b
    target = torch.randn(rows, vocab, generator=dgen, device=device) * scale
    if masked_tail:
        target[:, vocab - masked_tail:] = float("-inf")
    target = target.to(dtype)
    temperature, top_k, top_p, min_p = (t.to(device) for t in param_tensors(params))
    seeds = torch.randint(-2**62, 2**62, (b,), generator=gen, dtype=torch.int64).to(device)
    positions = torch.randint(0, 5000, (b,), generator=gen, dtype=torch.int64).to(device)
    req = torch.repeat_interleave(torch.arange(b), torch.tensor(ks, dtype=torch.int64))
    j = torch.arange(int(cu[-1])) - cu[req].long()
    ver_rows = cu[req].long() + req + j                                # verification rows
    req, j, ver_rows = req.to(device), j.to(device), ver_rows.to(device)
    draft_logits = target.float()[ver_rows] + noise * torch.randn(
        len(ver_rows), vocab, generator=dgen, device=device)
    if greedy_drafts:
        dparams = (torch.zeros(len(ver_rows), device=device), top_k[req], top_p[req],
                   min_p[req])
    else:
        dparams = (temperature[req], top_k[req], top_p[req], min_p[req])
    drafts, q = R.sample_draft(draft_logits, *dparams, seeds[req], positions[req] + j,
                               store_probs=True)
    return VerifyCase(target, cu, drafts, None if one_hot else q, temperature, top_k, top_p,
                      min_p, seeds, positions)


def replicated_case(n: int, k: int, params: tuple, vocab: int, seed: int,
                    one_hot: bool = False) -> tuple[VerifyCase, torch.Tensor, torch.Tensor]:
    """n requests sharing one pattern (same target and draft logits), seeds differ.

    Returns the case, p = probs(target rows of one request) [k + 1, V] and q [k, V]. The drafts
    x_j ~ q_j are independent torch.multinomial draws (the draws themselves are not under test;
    sample_draft's distribution is tested on its own).
    """
    from specserve.kernels import ref_sampling as R

    gen = torch.Generator().manual_seed(seed)
    target_one = torch.randn(k + 1, vocab, generator=gen) * 1.5             # [k + 1, V]
    draft_one = target_one[:k] + torch.randn(k, vocab, generator=gen)       # [k, V]
    p = R.probs(target_one, *param_tensors([params] * (k + 1)))
    q = R.probs(draft_one, *param_tensors([params] * k))
    drafts = torch.multinomial(q, n, replacement=True, generator=gen).T.reshape(-1)  # [n * k]
    temperature, top_k, top_p, min_p = param_tensors([params] * n)
    case = VerifyCase(target_one.repeat(n, 1), torch.arange(n + 1, dtype=torch.int32) * k,
                      drafts, None if one_hot else q.repeat(n, 1), temperature, top_k, top_p,
                      min_p, torch.arange(n, dtype=torch.int64) * 7919 + seed,
                      torch.zeros(n, dtype=torch.int64))
    return case, p, q


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness-of-fit p-value of ``counts`` against ``probs`` (zero-prob bins must
    be empty and are dropped; bins expected below ``min_expected`` are pooled)."""
    counts = counts.double()
    probs = probs.double()
    n = counts.sum()
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens outside the support: {counts[~support]}"
    c, p = counts[support], probs[support] / probs[support].sum()
    small = n * p < min_expected
    if small.any():
        c = torch.cat([c[~small], c[small].sum().reshape(1)])
        p = torch.cat([p[~small], p[small].sum().reshape(1)])
    if c.numel() < 2:
        return 1.0
    stat = ((c - n * p) ** 2 / (n * p)).sum()
    df = torch.tensor(float(c.numel() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))
