"""Exact target/draft distributions from transformers, the oracle for the spec-decode tests.

The truncation here (temperature, top-k, top-p by sorting) is written independently of the
kernels so that the tests check the kernels rather than repeat them.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats


def processed_probs(logits: torch.Tensor, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """softmax(logits / T) restricted to top-k then top-p (smallest head with mass >= top_p)."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    if top_k and top_k < p.shape[-1]:
        kth = torch.topk(p, top_k, dim=-1).values[..., -1:]
        p = torch.where(p >= kth, p, 0.0)
        p = p / p.sum(-1, keepdim=True)
    if top_p < 1.0:
        srt, idx = torch.sort(p, dim=-1, descending=True)
        before = torch.cumsum(srt, dim=-1) - srt          # mass strictly before each token
        keep_sorted = before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
        p = torch.where(keep, p, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


class Oracle:
    """Next-token distributions of a transformers model, memoised per context."""

    def __init__(self, path: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.no_grad()
    def logits(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        todo = [c for c in dict.fromkeys(contexts) if c not in self._cache]
        by_len: dict[int, list[tuple[int, ...]]] = {}
        for c in todo:
            by_len.setdefault(len(c), []).append(c)
        for _, group in by_len.items():
            for i in range(0, len(group), 256):
                chunk = group[i:i + 256]
                out = self.model(torch.tensor(chunk)).logits[:, -1]
                for c, row in zip(chunk, out):
                    self._cache[c] = row
        return [self._cache[c] for c in contexts]

    def probs(self, context: tuple[int, ...], temperature: float, top_k: int = 0,
              top_p: float = 1.0) -> torch.Tensor:
        return processed_probs(self.logits([context])[0], temperature, top_k, top_p)


def sequential_chi_square(samples: list[tuple[int, ...]], prompt: tuple[int, ...],
                          cond_probs, min_expected: float = 5.0,
                          min_group: int = 50) -> tuple[float, int, float]:
    """Goodness of fit of sampled sequences to the exact joint distribution.

    The joint factorises into conditionals; for each position t and each observed prefix with at
    least ``min_group`` samples, the next-token counts are compared with the exact conditional
    (tokens with expected count < ``min_expected`` pooled into one bin). The conditional tests
    are independent, so their chi-square statistics and degrees of freedom add up.
    Returns (statistic, dof, p-value).
    """
    total, dof = 0.0, 0
    length = len(samples[0])
    for t in range(length):
        groups: dict[tuple[int, ...], list[int]] = {}
        for s in samples:
            groups.setdefault(s[:t], []).append(s[t])
        for prefix, nxt in groups.items():
            if len(nxt) < min_group:
                continue
            p = cond_probs(prompt + prefix).numpy()
            n = len(nxt)
            counts = np.bincount(nxt, minlength=p.shape[0]).astype(float)
            expected = n * p
            big = expected >= min_expected
            obs = list(counts[big]) + [counts[~big].sum()]
            exp = list(expected[big]) + [expected[~big].sum()]
            if exp[-1] < min_expected:  # merge a too-small rest bin into the smallest big bin
                obs, exp = obs[:-1], exp[:-1]
                if obs:
                    obs[int(np.argmin(exp))] += counts[~big].sum()
                    exp[int(np.argmin(exp))] += expected[~big].sum()
            if len(obs) < 2:
                continue
            obs_a, exp_a = np.array(obs), np.array(exp)
            total += float(((obs_a - exp_a) ** 2 / exp_a).sum())
            dof += len(obs) - 1
    return total, dof, float(stats.chi2.sf(total, dof)) if dof else 1.0
