"""Teacher-forced acceptance metrics of a target/draft pair on a token stream.

For every position of a held-out token stream both models see the same prefix. With target
distribution p and draft distribution q after temperature T:

- greedy agreement: argmax p == argmax q (what greedy speculative decoding accepts);
- alpha(T) = sum_x min(p_T, q_T) (acceptance of lossless speculative sampling, Leviathan et al.);
- alpha_pq(T) = sum_x p_T q_T (acceptance when the draft probability is taken as 1);
- E_k = (1 - a^(k+1)) / (1 - a): expected tokens per target step for k drafted tokens,
  assuming independent acceptances.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

TEMPERATURES = (0.3, 0.5, 0.7, 1.0, 1.3, 1.5, 2.0)
KS = (3, 4, 5)


def expected_length(alpha: float, k: int) -> float:
    """Expected tokens per verification with k drafts and per-token acceptance alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _windows(ids: torch.Tensor, window: int) -> Iterable[torch.Tensor]:
    """Non-overlapping windows of window + 1 tokens (inputs plus the next-token labels)."""
    n = ids.numel()
    for start in range(0, max(n - 1, 0), window):
        chunk = ids[start:start + window + 1]
        if chunk.numel() >= 2:
            yield chunk


@torch.no_grad()
def pair_metrics(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor,
                 window: int = 1024, temperatures: Iterable[float] = TEMPERATURES) -> dict:
    """Losses, greedy agreement and alpha(T) of ``draft`` against ``target`` over ``ids``.

    ``ids`` is a 1-D LongTensor; it is cut into windows of ``window`` tokens, each scored
    teacher-forced from its own start. Computation is fp32 on the models' device.
    """
    device = next(target.parameters()).device
    temps = tuple(float(t) for t in temperatures)
    sums = {"t_nll": 0.0, "d_nll": 0.0, "agree": 0.0, "n": 0}
    s_min = dict.fromkeys(temps, 0.0)
    s_pq = dict.fromkeys(temps, 0.0)
    for chunk in _windows(ids.long(), window):
        x = chunk[:-1].unsqueeze(0).to(device)                   # [1, n]
        y = chunk[1:].to(device)                                 # [n]
        t_logits = target(input_ids=x).logits[0].float()         # [n, vocab]
        d_logits = draft(input_ids=x).logits[0].float()          # [n, vocab]
        vocab = min(t_logits.shape[-1], d_logits.shape[-1])
        t_logits, d_logits = t_logits[:, :vocab], d_logits[:, :vocab]
        sums["t_nll"] += torch.nn.functional.cross_entropy(t_logits, y, reduction="sum").item()
        sums["d_nll"] += torch.nn.functional.cross_entropy(d_logits, y, reduction="sum").item()
        sums["agree"] += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        sums["n"] += y.numel()
        for t in temps:
            p = torch.softmax(t_logits / t, dim=-1)              # [n, vocab]
            q = torch.softmax(d_logits / t, dim=-1)              # [n, vocab]
            s_min[t] += torch.minimum(p, q).sum().item()
            s_pq[t] += (p * q).sum().item()
    n = max(sums["n"], 1)
    alpha = {f"{t:g}": s_min[t] / n for t in temps}
    alpha_pq = {f"{t:g}": s_pq[t] / n for t in temps}
    greedy = sums["agree"] / n
    return {
        "num_tokens": sums["n"],
        "target_loss": sums["t_nll"] / n,
        "draft_loss": sums["d_nll"] / n,
        "target_ppl": math.exp(sums["t_nll"] / n),
        "draft_ppl": math.exp(sums["d_nll"] / n),
        "greedy_agreement": greedy,
        "alpha": alpha,
        "alpha_draft_prob_as_1": alpha_pq,
        "expected_length": {
            "greedy": {str(k): expected_length(greedy, k) for k in KS},
            **{f"T={key}": {str(k): expected_length(a, k) for k in KS} for key, a in alpha.items()},
        },
        "expected_length_draft_prob_as_1": {
            f"T={key}": {str(k): expected_length(a, k) for k in KS} for key, a in alpha_pq.items()
        },
    }
