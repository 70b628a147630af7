"""The exactness harness (specserve.bench.exactness) on the CPU, with the torch twin.

The GPU test (tests/gpu/test_exactness_gpu.py) runs the same harness at production shapes on
the Triton kernels; here it runs at V = 512 so the checks themselves are tested everywhere:

* its fp64 theory agrees with the twin's own probabilities (an independent re-implementation);
* its chi-square p-value agrees with scipy's;
* the correct sampler passes (|z| < 4, chi-square p > 1e-4 at 20,000 requests per cell);
* each deliberate breakage of the sampler fails (tests/kernels/sampler_breakages.py).
"""

from __future__ import annotations

import pytest
import torch

from specserve.bench import exactness as X
from specserve.kernels import ref_sampling as R
from tests.kernels.sampler_breakages import BREAKAGES, broken_module, detection_cell

CPU = torch.device("cpu")


@pytest.mark.parametrize("t, top_k, top_p", [(1.0, 0, 1.0), (0.6, 50, 0.9), (2.0, 5, 1.0), (1.0, 0, 0.5)])
def test_theory_matches_the_twin_distribution(t, top_k, top_p) -> None:
    g = torch.Generator().manual_seed(3)
    logits = X._zipf_logits(16, 512, g, CPU)
    want = X.filtered_probs64(logits, t, top_k, top_p)
    n = logits.shape[0]
    got = R.probs(logits, torch.full((n,), t), torch.full((n,), top_k, dtype=torch.int32),
                  torch.full((n,), top_p), torch.zeros(n))
    assert torch.equal(want > 0, got > 0)
    assert (want - got.double()).abs().max() < 1e-6


def test_chi_square_p_value_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    obs = torch.tensor([30.0, 52, 18, 3, 2, 95])
    exp = torch.tensor([25.0, 50, 25, 2, 3, 95])
    stat, df, p = X.chi_square(obs, exp)
    # the two categories under 5 are merged into one (expectation 5)
    ref = stats.chisquare([30, 52, 18, 5, 95], [25, 50, 25, 5, 95])
    assert df == 4 and stat == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("cell", X.quick_grid(20_000)[1:], ids=lambda c: c.name)
def test_the_twin_matches_theory(cell) -> None:
    res = X.run_cell(cell, CPU, R)
    assert res.passed, res.to_json()
    assert res.max_q_error < 1e-6
    assert min(res.reached) > 0 and res.residual_events > 100 and res.bonus_events > 100


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_breakage_fails(breakage, tmp_path) -> None:
    broken = broken_module(breakage, "torch", tmp_path)
    rows = {"bf16_q": 15_000, "bonus_from_residual": 20_000,
            "bonus_reuses_accept_draw": 20_000}.get(breakage, 10_000)
    res = X.run_cell(detection_cell(breakage, on_gpu=False, rows=rows), CPU, broken)
    assert not res.passed, f"{BREAKAGES[breakage].what}: not detected: {res.to_json()}"


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_triton_breakage_still_applies(breakage, tmp_path) -> None:
    """The GPU test breaks the Triton twin with these edits: each must still match the
    kernels and launcher exactly once (a refactor that moves an edited line fails here, on
    the CPU, instead of silently testing nothing on the GPU)."""
    pytest.importorskip("triton")
    broken = broken_module(breakage, "triton", tmp_path)
    assert callable(broken.rejection_sample)
