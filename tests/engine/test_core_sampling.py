"""Random sampling: per-request seeds are reproducible, and the first token has the right law.

* A seeded request yields the same tokens alone, inside a batch of 15 others of other lengths
  and parameters, and when it is preempted and recomputed; unseeded requests differ.
* The first sampled token follows ``softmax(logits / T)`` restricted by top-k, then top-p, then
  min-p (the order kernels/ref_sampling documents), computed here independently from the
  transformers model's logits. 2,048 draws (16 requests x n=128, fixed seeds); the check is a
  chi-square goodness-of-fit test at significance 1e-4 (bins with expected count < 5 pooled)
  plus "no draw outside the support". A deliberately wrong sampler must fail the same check.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")

from specserve.engine.types import SamplingParams  # noqa: E402

ALPHA = 1e-4              # false-failure probability of one goodness-of-fit check
NUM_REQUESTS, N_PER_REQUEST = 16, 128
MODEL = "llama"


# ---- seeds ------------------------------------------------------------------------------------

def _seeded(seed: int = 1234, **kw) -> SamplingParams:
    base = dict(temperature=0.9, top_k=50, top_p=0.95, max_tokens=20, ignore_eos=True, seed=seed)
    base.update(kw)
    return SamplingParams(**base)


def _others(prompts) -> tuple[list[list[int]], list[SamplingParams]]:
    """15 companions: other lengths, greedy / unseeded / seeded, penalties, filters."""
    ps = prompts([5, 40, 17, 1, 66, 23, 9, 31, 12, 50, 3, 27, 44, 8, 19], seed=21)
    params = []
    for i in range(len(ps)):
        kind = i % 4
        if kind == 0:
            params.append(SamplingParams(temperature=0.0, max_tokens=6 + i, ignore_eos=True))
        elif kind == 1:
            params.append(SamplingParams(temperature=1.3, max_tokens=10 + i, ignore_eos=True))
        elif kind == 2:
            params.append(_seeded(seed=77 + i, top_k=5, repetition_penalty=1.2, max_tokens=4 + 2 * i))
        else:
            params.append(SamplingParams(temperature=0.5, min_p=0.1, presence_penalty=0.5,
                                         max_tokens=25, ignore_eos=True))
    return ps, params


@pytest.mark.parametrize("params", [
    _seeded(),
    _seeded(seed=99, temperature=1.5, top_k=0, top_p=1.0, min_p=0.02, frequency_penalty=0.7),
], ids=["filters", "penalties"])
def test_seeded_request_same_alone_in_batch_and_preempted(params, make_llm, prompts, drive):
    prompt = prompts([29], seed=20)[0]
    alone = make_llm(MODEL).generate([prompt], params)[0].outputs[0].token_ids
    assert len(alone) == params.max_tokens

    others, other_params = _others(prompts)
    d = drive(make_llm(MODEL).core)
    d.add_all(others[:7], other_params[:7], prefix="x")
    d.add("target", prompt, params)
    d.add_all(others[7:], other_params[7:], prefix="y")
    run = d.until_done()
    assert max(s.num_running for s in run.stats) == 16
    assert run.tokens("target") == alone, "batch composition changed a seeded request's tokens"

    # a small pool; the target arrives last, so it is the most recently admitted and preempted
    d = drive(make_llm(MODEL, num_kv_blocks=8).core)
    d.add_all(others[:3], other_params[:3], prefix="z")
    d.add("target", prompt, params)
    run = d.until_done()
    assert run.final["target"].outputs[0].times.num_preemptions > 0, "the target was never preempted"
    assert run.tokens("target") == alone, "preemption changed a seeded request's tokens"


def test_unseeded_requests_differ_and_seeded_n_is_reproducible(make_llm, prompts):
    llm = make_llm(MODEL)
    prompt = prompts([10], seed=22)[0]
    free = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([prompt] * 4, free)
    token_lists = [tuple(o.outputs[0].token_ids) for o in outs]
    assert len(set(token_lists)) == 4, "unseeded requests produced identical samples"

    seeded = SamplingParams(n=4, temperature=1.0, max_tokens=12, ignore_eos=True, seed=5)
    first, again = llm.generate([prompt, prompt], seeded)
    assert [c.index for c in first.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 4, "the n completions are copies"
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]


def test_greedy_n_copies_the_greedy_answer(make_llm, hf, prompts):
    llm = make_llm(MODEL)
    prompt = prompts([15], seed=23)[0]
    [out] = llm.generate([prompt], SamplingParams(n=3, temperature=0.0, max_tokens=10, ignore_eos=True))
    assert len(out.outputs) == 3
    for c in out.outputs:
        assert c.token_ids == hf.greedy(MODEL, prompt, 10)


# ---- the first token's distribution ---------------------------------------------------------

def target_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0) -> torch.Tensor:
    """softmax(logits / T), then top-k, top-p (smallest head of mass >= top_p), min-p. [V] fp64."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    keep = torch.ones_like(p, dtype=torch.bool)
    if 0 < top_k < p.numel():
        keep &= p >= torch.topk(p, top_k).values[-1]
    if top_p < 1.0:
        q = torch.where(keep, p, 0.0)
        q = q / q.sum()
        srt, idx = torch.sort(q, descending=True)
        mass_before = torch.cumsum(srt, 0) - srt
        head = torch.zeros_like(keep)
        head[idx] = mass_before < top_p
        keep &= head
    if min_p > 0.0:
        keep &= p >= min_p * p.max()
    out = torch.where(keep, p, 0.0)
    return out / out.sum()


@dataclass
class Fit:
    ok: bool
    chi2: float
    critical: float
    df: int
    outside: int
    tv: float

    def __str__(self) -> str:
        return (f"chi2={self.chi2:.1f} (critical {self.critical:.1f}, df={self.df}), "
                f"draws outside the support={self.outside}, TV={self.tv:.4f}")


def goodness_of_fit(counts: Counter, p: torch.Tensor, alpha: float = ALPHA) -> Fit:
    """Chi-square test of ``counts`` against ``p`` (bins with expected < 5 pooled into one)."""
    total = sum(counts.values())
    support = [int(t) for t in torch.nonzero(p > 0).flatten()]
    outside = total - sum(counts[t] for t in support)
    bins, pool_obs, pool_exp = [], 0, 0.0
    for t in support:
        exp = total * float(p[t])
        if exp < 5:
            pool_obs, pool_exp = pool_obs + counts[t], pool_exp + exp
        else:
            bins.append((counts[t], exp))
    if pool_exp > 0:
        bins.append((pool_obs, pool_exp))
    chi2 = sum((o - e) ** 2 / e for o, e in bins)
    df = max(1, len(bins) - 1)
    critical = float(stats.chi2.isf(alpha, df))
    emp = torch.zeros_like(p)
    for t, c in counts.items():
        emp[t] = c / total
    tv = 0.5 * float((emp - p).abs().sum())
    return Fit(outside == 0 and chi2 <= critical, chi2, critical, df, outside, tv)


CASES = {
    # name: (sampling filters, how the deliberately wrong sampler breaks them)
    "temperature": (dict(temperature=0.6), "temperature_one"),
    "top_k": (dict(temperature=0.8, top_k=10), "ignore_top_k"),
    "top_p": (dict(temperature=1.0, top_p=0.6), "ignore_top_p"),
    "min_p": (dict(temperature=0.9, min_p=0.3), "ignore_min_p"),
    "combined": (dict(temperature=0.7, top_k=40, top_p=0.85, min_p=0.05), "temperature_one"),
}


def _first_token_counts(llm, prompt: list[int], filters: dict) -> Counter:
    params = [SamplingParams(n=N_PER_REQUEST, seed=10_000 + N_PER_REQUEST * j, max_tokens=1,
                             ignore_eos=True, **filters) for j in range(NUM_REQUESTS)]
    outs = llm.generate([prompt] * NUM_REQUESTS, params)
    return Counter(c.token_ids[0] for o in outs for c in o.outputs)


@pytest.fixture(scope="module")
def dist_prompt(prompts) -> list[int]:
    return prompts([5], seed=24)[0]


def _sampling_llm(make_llm):
    return make_llm(MODEL, max_num_seqs=512, max_num_batched_tokens=8192)


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_token_distribution(case, make_llm, hf, dist_prompt):
    filters, _ = CASES[case]
    p = target_probs(hf.logits(MODEL, dist_prompt)[-1], **filters)
    fit = goodness_of_fit(_first_token_counts(_sampling_llm(make_llm), dist_prompt, filters), p)
    assert fit.ok, f"{case}: first-token distribution does not match softmax(z/T) filtered: {fit}"


def _wrong_row_distribution(kind: str, original):
    def wrong(logits, temperature, top_k, top_p, min_p):
        if kind == "temperature_one":
            temperature = torch.where(temperature > 0, torch.ones_like(temperature), temperature)
        elif kind == "ignore_top_k":
            top_k = torch.zeros_like(top_k)
        elif kind == "ignore_top_p":
            top_p = torch.ones_like(top_p)
        elif kind == "ignore_min_p":
            min_p = torch.zeros_like(min_p)
        return original(logits, temperature, top_k, top_p, min_p)
    return wrong


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_distribution_check_fails_on_a_wrong_sampler(case, make_llm, hf, dist_prompt, monkeypatch):
    """The checker is checked: a sampler that drops one part of the transform must be caught."""
    from specserve.kernels import ref_sampling

    filters, breakage = CASES[case]
    monkeypatch.setattr(ref_sampling, "row_distribution",
                        _wrong_row_distribution(breakage, ref_sampling.row_distribution))
    p = target_probs(hf.logits(MODEL, dist_prompt)[-1], **filters)
    fit = goodness_of_fit(_first_token_counts(_sampling_llm(make_llm), dist_prompt, filters), p)
    assert not fit.ok, f"{case}: a sampler with '{breakage}' passed the check: {fit}"
