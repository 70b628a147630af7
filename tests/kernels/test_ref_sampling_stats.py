"""Statistical tests of the reference sampler: exactness and acceptance rates.

N requests share one (target, draft) pattern and differ only in their seed, so each emitted token
is an independent draw. Fixed seeds make every run identical; the thresholds are:

* distribution: chi-square goodness of fit, p-value > 1e-3 (bins expected < 5 pooled; a token
  outside the target's support fails outright);
* acceptance rate of position 0: |observed - theory| < 4.5 standard errors, theory
  sum_x min(p, q) (probabilistic with draft probs), sum_x q(x) p(x) (one-hot drafts, strict).

The same checks run against deliberately broken samplers (a wrong residual) and must fail there
with p-value < 1e-6, which shows they have the power to catch the bugs they exist for.
(The Triton twin draws bit-identical random numbers and is compared token-for-token with this
reference in test_triton_sampling.py; tests/gpu repeats the statistics on the GPU kernels.)
"""

from __future__ import annotations

import math

import pytest
import torch

from specserve.kernels import ref_sampling as R

try:
    from tests.kernels.sampling_cases import PARAM_SETS, chi2_pvalue, param_tensors, replicated_case
except ImportError:  # rootdir-less runs of this directory
    from sampling_cases import PARAM_SETS, chi2_pvalue, param_tensors, replicated_case

N = 8000           # requests (independent draws) per case
K = 2              # drafts per request
VOCAB = 12
P_MIN = 1e-3       # a correct sampler must pass the chi-square test at this level
P_BROKEN = 1e-6    # a broken sampler must fail it this clearly
Z_MAX = 4.5        # acceptance rate tolerance in standard errors

# (method, draft probs passed) -> acceptance-rate theory at position 0
VARIANTS = {
    "probabilistic": ("probabilistic", False),
    "probabilistic_one_hot": ("probabilistic", True),
    "strict": ("strict", False),
}


def _theory(variant: str, p0: torch.Tensor, q0: torch.Tensor) -> float:
    if variant == "probabilistic":
        return float(torch.minimum(p0, q0).sum())
    return float((p0 * q0).sum())


def check_verification(variant: str, params: tuple, seed: int, sampler=None, n: int = N,
                       device: str = "cpu", vocab: int = VOCAB) -> None:
    """Emitted tokens at every depth follow the target; acceptance at 0 matches the theory.

    ``sampler`` defaults to the reference rejection_sample (tests/gpu passes the Triton one).
    """
    method, one_hot = VARIANTS[variant]
    case, p, q = replicated_case(n, K, params, vocab, seed, one_hot=one_hot)
    sampler = sampler or R.rejection_sample
    out = sampler(*case.to(device).args(method)).cpu()                      # [n, K + 1]
    # token j is emitted by every request that accepted the j drafts before it
    for j in range(K + 1):
        reached = out[:, j] >= 0
        if j and int(reached.sum()) < 200:
            continue
        counts = torch.bincount(out[reached, j], minlength=vocab)
        pv = chi2_pvalue(counts, p[j])
        assert pv > P_MIN, f"depth {j}: emitted tokens do not follow p (chi2 p-value {pv:.2e})"
    rate = float((out[:, 1] >= 0).float().mean())
    want = _theory(variant, p[0], q[0])
    se = math.sqrt(max(want * (1 - want), 1e-4) / n)
    assert abs(rate - want) < Z_MAX * se, f"acceptance {rate:.4f} vs theory {want:.4f}"


# every parameter set with draft probs; the other two variants on a plain and a filtered set
CASES = ([("probabilistic", name) for name in PARAM_SETS]
         + [(v, name) for v in ("probabilistic_one_hot", "strict") for name in ("t1", "t0.8_all")])


@pytest.mark.parametrize("variant,name", CASES)
def test_verification_is_exact(variant: str, name: str) -> None:
    check_verification(variant, PARAM_SETS[name], seed=100 + len(name))


BROKEN = {  # _residual(w, S, q) scaled by the mass: S max(p - q, 0) with p = w / S
    # the replacement drawn from p itself: over-weights the tokens q already proposed
    "residual_is_p": lambda w, mass, q: w,
    # the residual with the sign flipped
    "residual_q_minus_p": lambda w, mass, q: torch.clamp(mass * q - w, min=0.0),
}


@pytest.mark.parametrize("broken", list(BROKEN))
@pytest.mark.parametrize("variant", ["probabilistic", "probabilistic_one_hot"])
def test_statistical_check_catches_a_broken_sampler(monkeypatch: pytest.MonkeyPatch,
                                                    broken: str, variant: str) -> None:
    monkeypatch.setattr(R, "_residual", BROKEN[broken])
    with pytest.raises(AssertionError, match="do not follow p") as err:
        check_verification(variant, PARAM_SETS["t1"], seed=101)
    pv = float(str(err.value).split("p-value ")[1].split(")")[0])
    assert pv < P_BROKEN


def test_the_broken_residual_is_really_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard for the test above: the patch point is the one rejection_sample calls."""
    calls = []
    monkeypatch.setattr(R, "_residual", lambda w, mass, q: calls.append(1) or torch.clamp(w - mass * q, min=0))
    check_verification("probabilistic", PARAM_SETS["t1"], seed=101)
    assert calls


@pytest.mark.parametrize("name", list(PARAM_SETS))
def test_sample_draft_follows_q(name: str) -> None:
    z = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(7)) * 1.5
    params = param_tensors([PARAM_SETS[name]] * N)
    tok, _ = R.sample_draft(z.expand(N, VOCAB), *params, torch.arange(N) * 3 + 1,
                            torch.full((N,), 5), store_probs=False)
    q = R.probs(z, *param_tensors([PARAM_SETS[name]]))[0]
    assert chi2_pvalue(torch.bincount(tok, minlength=VOCAB), q) > P_MIN


def test_sample_draft_check_catches_a_wrong_temperature() -> None:
    z = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(7)) * 1.5
    tok, _ = R.sample_draft(z.expand(N, VOCAB), *param_tensors([(1.3, 0, 1.0, 0.0)] * N),
                            torch.arange(N) * 3 + 1, torch.full((N,), 5), store_probs=False)
    q = R.probs(z, *param_tensors([(1.0, 0, 1.0, 0.0)]))[0]
    assert chi2_pvalue(torch.bincount(tok, minlength=VOCAB), q) < P_BROKEN
