"""The rejection sampler against exact theory at production shapes, on the Triton kernels.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_exactness_gpu.py`` (about N minutes on
an H100); set ``EXACTNESS_OUT=DIR`` to also write the table, JSON and plot
(``specserve.bench.exactness`` documents the method; docs/exactness.md holds the committed run).

* Every cell of the grid (V in {32,000, 151,936}; bf16 and fp32 logits; B in {1, 8, 64, 256};
  k in {1, 3, 5, 8}; T in {0.6, 1, 2}, with and without top-k / top-p; probabilistic, strict
  and greedy-draft verification; a near-copy draft) verifies 100,000 requests: every draft
  position's acceptance within 4 standard deviations of its exact expectation, and the tokens
  emitted at the first rejection and as the bonus pass their chi-square at p > 1e-4.
* Each deliberate breakage of the Triton kernels (tests/kernels/sampler_breakages.py) fails
  those same checks at production shape.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from specserve.bench import exactness as X  # noqa: E402
from specserve.kernels import triton_sampling as TS  # noqa: E402
from tests.kernels.sampler_breakages import BREAKAGES, broken_module, detection_cell  # noqa: E402

ROWS = int(os.environ.get("EXACTNESS_ROWS", "100000"))
CUDA = torch.device("cuda")
RESULTS: list = []
BROKEN: dict = {}


def _report() -> None:
    """Rewrite the table after every cell (a run cut short still leaves what it measured)."""
    out = os.environ.get("EXACTNESS_OUT")
    if out:
        X.write_report(RESULTS, Path(out), f"EXACTNESS_ROWS={ROWS} pytest -m gpu tests/gpu/test_exactness_gpu.py",
                       torch.cuda.get_device_name(), with_plot=False, breakages=BROKEN)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cell", X.full_grid(ROWS), ids=lambda c: c.name.replace(" ", "-"))
def test_matches_exact_theory(cell) -> None:
    res = X.run_cell(cell, CUDA, TS, log=print)
    RESULTS.append(res)
    _report()
    assert res.passed, res.to_json()
    assert res.max_q_error < 1e-5


@pytest.mark.timeout(600)
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_breakage_fails(breakage, tmp_path) -> None:
    broken = broken_module(breakage, "triton", tmp_path)
    res = X.run_cell(detection_cell(breakage, on_gpu=True, rows=ROWS), CUDA, broken, log=print)
    BROKEN[breakage] = res
    _report()
    assert not res.passed, f"{BREAKAGES[breakage].what}: not detected: {res.to_json()}"
