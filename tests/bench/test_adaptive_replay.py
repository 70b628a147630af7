"""scripts/adaptive_replay.py: greedy match bits read back from a fixed-k step trace, the replay's
arithmetic against hand-counted steps, and its fixed k against the speed-up a fixed k must give."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "adaptive_replay.py"


@pytest.fixture(scope="module")
def rp():
    spec = importlib.util.spec_from_file_location("adaptive_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["adaptive_replay"] = module          # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    yield module
    del sys.modules["adaptive_replay"]


def test_bits_from_fixed_steps(rp) -> None:
    # k = 4: accepted 2 (ones, then a zero), 4 (four ones, the bonus unseen), 0 (a zero)
    assert rp.matches_from_fixed_trace([2, 4, 0], 4, fill=7) == [7, 1, 1, 0, 1, 1, 1, 1, 7, 0]


def test_trace_log_is_read(rp, tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("mid-T0-B1-r0: 500 tok/s\n   0 2.0 None 0 1 1\n"
                   "mid-T0-B1-fixed4: 700.3 tok/s, 3 decode steps\n"
                   "   0 4.4 None 4 4 3 2.2 1.9 [1] None\n   1 4.4 None 4 4 5 2.2 1.9 [1] None\n"
                   "   2 3.4 None 3 2 4 2.2 1.0 [1] None\n  gc: 0 collections\n")
    assert rp.read_fixed_trace(log) == ([2, 4], 4)    # the last step verified 3, not 4


def test_replay_counts_steps_and_tokens(rp) -> None:
    m = [1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
    ms = [1.0, 2.0, 3.0]
    truth = lambda n, k: ms[k] * 1e-3   # noqa: E731
    # fixed k = 2 from token 1: accept 2 (tokens 1-3 committed), 2 more (4-6; the zero at
    # token 3 was the target's own token, never drafted at k = 2), 2 (7-9), and token 10 with
    # no room left to draft: 4 steps, 3 of them at k = 2
    run = rp.replay(None, [m], 11, 2, truth, lambda n: 0.0, random.Random(0), 0.0, fixed=2)
    assert run.steps == 4 and run.tokens == 10 and run.chosen == [1, 0, 3]
    assert run.seconds == pytest.approx(3 * 3e-3 + 1e-3)
    m[4] = 0          # the second step now rejects its first draft: one token there
    run = rp.replay(None, [m], 11, 2, truth, lambda n: 0.0, random.Random(0), 0.0, fixed=2)
    assert run.steps == 4 and run.tokens == 10 and run.chosen == [0, 0, 4]
    assert run.seconds == pytest.approx(4 * 3e-3)
    plain = rp.replay(None, [m], 11, 2, truth, lambda n: 0.0, random.Random(0), 0.0, fixed=0)
    assert plain.steps == 10 and plain.seconds == pytest.approx(10e-3)


def test_fixed_k_on_recorded_bits_matches_the_gpu(rp) -> None:
    """The call-9 trace's bits and step times give the fixed-k tok/s the GPU measured for k = 4
    (700 tok/s) and plain (537): the replay's arithmetic is the engine's."""
    log = Path(__file__).resolve().parents[2] / "docs/bench-h100/draft-profile/call9_h100_decisions_b1_t0.log"
    accepted, k = rp.read_fixed_trace(log)
    m = rp.matches_from_fixed_trace(accepted, k, 1)
    truth = lambda n, kk: rp.H100_MID_B1_MS[kk] * 1e-3   # noqa: E731
    tps = {kk: rp.replay(None, [m], len(m), 8, truth, lambda n: 0.0, random.Random(0), 0.0,
                         fixed=kk).tok_per_s for kk in (0, 4)}
    assert tps[4] == pytest.approx(700, rel=0.02) and tps[0] == pytest.approx(537, rel=0.01)


def test_measured_step_times_interpolate_between_fixed_k(rp) -> None:
    assert rp._interp_ms({"0": 1.0, "2": 3.0, "8": 9.0}, 8) == pytest.approx(
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])


def test_greedy_bits_then_replay_end_to_end(rp, tmp_path: Path) -> None:
    """scripts/greedy_bits.py on the tiny CPU shapes (the unrelated draft, so that its bits
    hold zeros) as a user runs it, then the replay on its JSON: every bit a fixed-k run saw is
    read back, runs at different k agree on every bit (the CPU is deterministic), and the
    replay's fixed k reads the step times the script measured."""
    out = tmp_path / "bits"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "greedy_bits.py"), "--tiny",
                           "--batches", "2", "--ks", "3,2,0", "--draft", "unrelated"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((out / "greedy_bits.json").read_text())
    cell = d["cells"]["2"]
    n = d["settings"]["output_len"]["2"]
    assert len(cell["bits"]) == 2 and all(len(r) == n + 1 for r in cell["bits"])
    assert cell["conflicts"] == 0 and 0 < cell["ones"] < 1
    assert cell["unseen"] < 0.1 * 2 * (n - 1)
    assert set(cell["step_ms"]) == {"3", "2", "0"} and all(v > 0 for v in cell["step_ms"].values())
    cells, warm, cal = rp.load_bits(out / "greedy_bits.json", 1, 3)
    assert len(warm) == 4 and all(len(w) == rp.WARM_TOKENS for w in warm) and cal.batches
    assert cells[0].step_ms[3] == cell["step_ms"]["3"]
    fixed = rp.replay(None, cells[0].rows, n, 3, rp._truth(cells[0], rp.CostModel(cal)), lambda t: 0.0,
                      random.Random(0), 0.0, fixed=0)
    assert fixed.steps == n - 1 and fixed.seconds == pytest.approx((n - 1) * cell["step_ms"]["0"] * 1e-3)
