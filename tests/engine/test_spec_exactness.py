"""Speculative decoding is lossless: sampled output has exactly the target's distribution, and
acceptance is as high as the theory says (sum of min(p, q)), not the one-hot shortfall.

The pair: a peaky tiny Llama (24-token vocabulary so that conditionals can be tested exactly)
and a draft made from it by adding weight noise (q close to p, but not equal).
Tolerances: each goodness-of-fit test uses a chi-square p-value threshold of 1e-3 (seeds are
fixed, so the outcome is deterministic; a correct sampler passes with probability 0.999 per
test for fresh seeds). Acceptance-rate checks allow 4 standard errors.
"""

from __future__ import annotations

import math

import pytest
import torch

from specserve.engine import LLM, SamplingParams
from specserve.engine.core import EngineCore
from specserve.kernels import ref_sampling
from tests.engine.spec_oracle import Oracle, sequential_chi_square
from tests.helpers.adaptive_k import force_random_k
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

PROMPT = (7, 12, 5, 9, 20, 3)
K = 3
P_THRESHOLD = 1e-3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_pair")
    target = make_tiny_checkpoint(root / "target", "llama", seed=1, initializer_range=0.2,
                                  model_vocab_size=24)
    draft = make_perturbed_copy(target, root / "draft", noise=0.03, seed=3)
    return str(target), str(draft)


@pytest.fixture(scope="module")
def oracles(pair):
    return Oracle(pair[0]), Oracle(pair[1])


# fixed: k = K every step; random-k: the adaptive controller's decision replaced by a random k in
# [low, K] per request per step (test hook), which covers every choice it can make, k = 0 included
K_MODES = ["fixed", "random-k"]


def _llm(pair, k_mode: str = "fixed", low: int = 0, **kw) -> LLM:
    kw.setdefault("num_speculative_tokens", K)
    llm = LLM(pair[0], draft_model=pair[1], device="cpu", max_num_seqs=256,
              max_num_batched_tokens=4096,
              speculative_k="fixed" if k_mode == "fixed" else "adaptive", **kw)
    if k_mode == "random-k":
        force_random_k(llm.core, seed=11, low=low)
    return llm


def _sample_first_tokens(llm: LLM, num_requests: int, n: int, length: int, **params):
    sp = [SamplingParams(n=n, seed=10_000 * (r + 1), max_tokens=length + 1, ignore_eos=True, **params)
          for r in range(num_requests)]
    outs = llm.generate([list(PROMPT)] * num_requests, sp)
    llm.core.kv.pool.check_all_free()
    samples = [tuple(c.token_ids[:length]) for o in outs for c in o.outputs]
    drafts = sum(c.spec_decode.num_draft_tokens for o in outs for c in o.outputs)
    accepted = sum(c.spec_decode.num_accepted_tokens for o in outs for c in o.outputs)
    return samples, drafts, accepted


CASES = [
    dict(temperature=0.6),
    dict(temperature=1.0),
    dict(temperature=2.0),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.0, top_k=5),
]


@pytest.mark.parametrize("k_mode", K_MODES)
@pytest.mark.parametrize("params", CASES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_first_three_tokens_follow_the_target_distribution(pair, oracles, params, k_mode):
    llm = _llm(pair, k_mode)
    samples, drafts, accepted = _sample_first_tokens(llm, 96, 64, 3, **params)
    assert drafts > 0 and 0 < accepted < drafts, "the test must exercise both acceptance and rejection"
    target = oracles[0]
    stat, dof, pval = sequential_chi_square(
        samples, PROMPT, lambda ctx: target.probs(ctx, params["temperature"], params.get("top_k", 0),
                                                   params.get("top_p", 1.0)))
    assert dof > 20
    assert pval > P_THRESHOLD, f"chi2={stat:.1f} dof={dof} p={pval:.2e}: not the target's distribution"


def test_the_distribution_test_catches_a_sampler_that_resamples_from_p(pair, oracles, monkeypatch):
    """Break the recovery step (race over p instead of max(p - q, 0)); the same test must fail."""
    original = ref_sampling._final_tokens

    def resample_from_p(method, d, logits, lay, sel, n_acc, x, q, *rest):
        return original(method, d, logits, lay, sel, n_acc, x, None if q is None else torch.zeros_like(q), *rest)

    monkeypatch.setattr(ref_sampling, "_final_tokens", resample_from_p)
    llm = _llm(pair)
    samples, _, _ = _sample_first_tokens(llm, 96, 64, 3, temperature=1.0)
    stat, dof, pval = sequential_chi_square(samples, PROMPT, lambda ctx: oracles[0].probs(ctx, 1.0))
    assert pval < P_THRESHOLD, f"a broken sampler passed (chi2={stat:.1f} dof={dof} p={pval:.2e})"


# ---- acceptance efficiency --------------------------------------------------------------------

def _verification_events(core: EngineCore, num_requests: int, n: int, max_tokens: int, temperature: float):
    """Drive the engine step by step; return (context, k, accepted) for every verification.

    Seeds are spaced so that no two sequences share one (child i of a request gets seed + i).
    """
    for r in range(num_requests):
        core.add_request(f"acc-{r}", list(PROMPT), SamplingParams(n=n, seed=1000 * (r + 1), max_tokens=max_tokens,
                                                                  ignore_eos=True, temperature=temperature))
    seen: dict[tuple[str, int], tuple[list[int], int, int]] = {}
    events = []
    while core.has_unfinished():
        outputs, _ = core.step()
        for out in outputs:
            for c in out.outputs:
                key = (out.request_id, c.index)
                prev_tokens, prev_drafts, prev_acc = seen.get(key, ([], 0, 0))
                dk = c.spec_decode.num_draft_tokens - prev_drafts
                if dk > 0:
                    events.append((PROMPT + tuple(prev_tokens), dk, c.spec_decode.num_accepted_tokens - prev_acc))
                seen[key] = (list(c.token_ids), c.spec_decode.num_draft_tokens, c.spec_decode.num_accepted_tokens)
    core.kv.pool.check_all_free()
    return events


def _check_rate(measured: list[float], theory: list[float], what: str) -> None:
    m = len(measured)
    got, want = sum(measured) / m, sum(theory) / m
    se = math.sqrt(sum(t * (1 - t) for t in theory)) / m
    assert abs(got - want) <= 4 * se + 1e-9, f"{what}: measured {got:.4f}, theory {want:.4f} (se {se:.4f}, m={m})"


def _alpha(p: torch.Tensor, q: torch.Tensor) -> float:
    return float(torch.minimum(p, q).sum())


def _coupled_match(p: torch.Tensor, q: torch.Tensor) -> float:
    """P(x == t) when x ~ q and t ~ p are exponential races over the same E_i ~ Exp(1)
    (x = argmin E_i / q_i, t = argmin E_i / p_i): given E_i = e, both pick i iff every other
    E_j exceeds e * max(p_j / p_i, q_j / q_i), so P(x = t = i) = 1 / sum_j max(p_j / p_i, q_j / q_i)."""
    both = (p > 0) & (q > 0)
    ratios = torch.maximum(p[None, :] / p[both][:, None], q[None, :] / q[both][:, None])   # [n, V]
    return float((1.0 / ratios.sum(dim=1)).sum())


@pytest.mark.parametrize("k_mode", K_MODES)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_acceptance_per_position_matches_sum_min_p_q(pair, oracles, temperature, k_mode):
    llm = _llm(pair, k_mode, low=1)   # k = 0 steps verify nothing: no events to count
    events = _verification_events(llm.core, 24, 16, 10, temperature)
    target, draft = oracles
    pos0_m, pos0_t, pos1_m, pos1_t = [], [], [], []
    for ctx, k, a in events:
        p, q = target.probs(ctx, temperature), draft.probs(ctx, temperature)
        pos0_m.append(float(a >= 1))
        pos0_t.append(_alpha(p, q))
        if k >= 2:
            overlap = torch.minimum(p, q)
            children = [ctx + (x,) for x in range(p.shape[0])]
            target.logits(children), draft.logits(children)  # batch the oracle forwards
            a1 = sum(float(overlap[x]) * _alpha(target.probs(c, temperature), draft.probs(c, temperature))
                     for x, c in enumerate(children) if overlap[x] > 0)
            pos1_m.append(float(a >= 2))
            pos1_t.append(a1)
    assert len(pos0_m) > 500 and len(pos1_m) > 300
    _check_rate(pos0_m, pos0_t, "position 0")
    _check_rate(pos1_m, pos1_t, "position 1")
    # the one-hot shortfall (sum q*p) is far below: the test would catch missing draft probs
    onehot = sum(float((target.probs(c, temperature) * draft.probs(c, temperature)).sum()) for c, _, _ in events)
    assert onehot / len(events) < sum(pos0_m) / len(pos0_m) - 0.2


@pytest.mark.parametrize("k_mode", K_MODES)
@pytest.mark.parametrize("mode", ["strict", "greedy-drafts"])
def test_acceptance_of_strict_and_greedy_draft_modes_matches_their_theory(pair, oracles, mode, k_mode):
    kw = dict(rejection_sample_method="strict") if mode == "strict" else dict(draft_sample_method="greedy")
    llm = _llm(pair, k_mode, low=1, **kw)
    events = _verification_events(llm.core, 24, 16, 10, 1.0)
    target, draft = oracles
    measured, theory, independent = [], [], []
    for ctx, _, a in events:
        p, q = target.probs(ctx, 1.0), draft.probs(ctx, 1.0)
        measured.append(float(a >= 1))
        # strict: x ~ q raced with the random numbers of t ~ p (the same stream), accept iff
        # equal; greedy drafts: x = argmax q, accept w.p. p(x)
        theory.append(_coupled_match(p, q) if mode == "strict" else float(p[int(q.argmax())]))
        independent.append(float((p * q).sum()))
    assert len(measured) > 500
    _check_rate(measured, theory, mode)
    if mode == "strict":   # drafts raced on their own stream would match only sum p*q: far below
        assert sum(theory) - sum(independent) > 0.1 * len(theory)
