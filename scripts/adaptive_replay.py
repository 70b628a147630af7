"""Replay the adaptive-k controller on recorded greedy outcomes, in seconds, without a GPU.

At T = 0 the draft's proposal for a position depends only on the committed tokens before it,
which greedy verification makes the target's own. So a request's whole speculative run, for any
choice of k at any step, follows from one bit per output token: whether the draft's greedy
token there equals the target's (``matches``). A step at token t with k drafts accepts the
leading run of ones in matches[t:t + k] and commits one token more.

This script reads those bits from a step trace of fixed k (``scripts/adaptive_decisions.py
--fixed-ks 4`` prints one line per step; the bits after a step that accepted every draft are
not observed and are filled with ``--fill``), prices each step with step times measured on the
GPU (``--step-ms``, k = 0 .. k_max at batch 1) and drives the engine's own KController,
AcceptanceModel and CostModel step by step, the way SpecControl does: hold at k = 0, decide,
record the verifications in their generation phase, observe the step's time. Each replay runs
the bench's cell order on one controller (a short warm-up, then the cell ``--runs`` times) and
prints tokens/s of every run against every fixed k on the same bits.

    python scripts/adaptive_replay.py --trace docs/bench-h100/draft-profile/call9_h100_decisions_b1_t0.log

It is a design tool, not a benchmark: the GPU bench decides (scripts/gpu_run.sh bench
--sections adaptive).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specserve.engine.spec_control import (AcceptanceModel, Calibration, CostModel, KController,
                                           Row, generation_phase, temperature_bucket)

# the H100's batch-1 step times of the bench's truncated-draft pair (call 9's trace, ms), k = 0..8
H100_MID_B1_MS = (1.86, 2.79, 3.45, 4.18, 4.43, 5.03, 5.58, 6.08, 6.69)


def matches_from_fixed_trace(accepted: list[int], k: int, fill: int, first: int = 1) -> list[int]:
    """Per output token (index 0 is the prefill's token), 1 where the draft's greedy token
    equals the target's, from the accepted counts of consecutive steps at fixed ``k``: a step
    starting at token t that accepted a < k drafts saw ones at t .. t + a - 1 and a zero at
    t + a; one that accepted all k leaves token t + k (the bonus) unobserved: ``fill``."""
    m = [fill] * first
    for a in accepted:
        m.extend([1] * a)
        m.append(0 if a < k else fill)
    return m


def read_fixed_trace(path: Path, label: str = "fixed") -> tuple[list[int], int]:
    """(accepted per step, k) of the first fixed-k run in an adaptive_decisions.py log."""
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if re.search(rf"-{label}(\d+):", ln))
    k = int(re.search(rf"-{label}(\d+):", lines[start]).group(1))
    accepted = []
    for ln in lines[start + 1:]:
        f = ln.split()
        if len(f) < 6 or not f[0].isdigit():
            break
        drafts, tokens = int(f[3]), int(f[5])
        if drafts == k:
            accepted.append(tokens - 1)
    return accepted, k


def run_length(m: list[int], t: int, k: int) -> int:
    n = 0
    while n < k and t + n < len(m) and m[t + n]:
        n += 1
    return n


@dataclass
class RunResult:
    tokens: int
    seconds: float
    steps: int
    chosen: list[int]

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds


def replay(ctl: Optional[KController], matches: list[list[int]], output_len: int, k_max: int,
           step_seconds: Callable[[int, int], float], catchup: Callable[[int], float],
           rng: random.Random, noise: float, fixed: Optional[int] = None,
           request_tag: str = "r") -> RunResult:
    """One cell: len(matches) requests decode ``output_len`` tokens together at T = 0, with
    ``ctl`` choosing k (or every step at ``fixed``)."""
    b = len(matches)
    pos = [1] * b                        # output tokens committed (the prefill made the first)
    lag = [0] * b                        # tokens the draft's KV has not seen
    ids = [f"{request_tag}{i}" for i in range(b)]
    bucket = temperature_bucket(0.0)
    seconds, steps, chosen = 0.0, 0, [0] * (k_max + 1)
    while any(p < output_len for p in pos):
        live = [i for i in range(b) if pos[i] < output_len]
        n = len(live)
        budget = {i: max(0, min(k_max, output_len - pos[i] - 1)) for i in live}
        if fixed is not None:
            ks = {i: min(fixed, budget[i]) for i in live}
        else:
            ctl.acceptance.tick()
            if ctl.current == 0 and ctl.hold_zero(n):
                ks = {i: 0 for i in live}
            else:
                rows = [Row(ids[i], bucket, budget[i], None, lag[i], output_len - pos[i],
                            generation_phase(pos[i])) for i in live]
                d = ctl.decide(rows)
                ks = dict(zip(live, d.ks))
        k = max(ks.values())
        t = step_seconds(n, k) * math.exp(rng.gauss(0.0, noise))
        if k:
            t += catchup(sum(lag[i] for i in live if ks[i]))
        verified, tokens = [], 0
        for i in live:
            a = run_length(matches[i], pos[i], ks[i])
            if ks[i]:
                verified.append((ids[i], bucket, ks[i], a, generation_phase(pos[i])))
                lag[i] = 0
            else:
                lag[i] += 1 + a
            pos[i] += 1 + a
            tokens += 1 + a
            chosen[ks[i]] += 1
        if ctl is not None and fixed is None:
            if verified:
                ctl.acceptance.record_step(verified)
            ctl.observe_step(n, k, k, tokens, t)
        seconds += t
        steps += 1
    if ctl is not None:
        for i in ids:
            ctl.acceptance.forget(i)
    return RunResult(sum(min(p, output_len) - 1 for p in pos), seconds, steps, chosen)


def calibration_from(step_ms: list[float], batch_scale: float = 1.0) -> Calibration:
    """A batch-1 calibration whose widths reproduce ``step_ms`` (target part: the plain step;
    the rest as draft passes), as start-up would measure it."""
    plain = step_ms[0] * 1e-3
    draft = [(s - step_ms[0]) * 1e-3 / max(k, 1) for k, s in enumerate(step_ms)][1:]
    d = statistics.median(draft)
    widths = list(range(1, len(step_ms) + 1))
    target = [plain + max(0.0, (step_ms[w - 1] * 1e-3 - plain) - (w - 1) * d) for w in widths]
    return Calibration([1], widths, [target], [d], padded=True, catchup_token=1.26e-6,
                       catchup_fixed=2e-3, catchup_graph_tokens=1024, catchup_graph_token=1.26e-6,
                       catchup_graph_fixed=4.7e-4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, required=True, help="adaptive_decisions.py log with a fixed-k run")
    p.add_argument("--fill", type=int, default=1, help="the unobserved bit after a fully accepted step")
    p.add_argument("--step-ms", default=",".join(map(str, H100_MID_B1_MS)),
                   help="measured batch-1 step ms at k = 0 .. k_max")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="adaptive runs of the cell on one controller")
    p.add_argument("--seeds", type=int, default=20, help="replays (step-time noise seeds)")
    p.add_argument("--noise", type=float, default=0.03, help="log-normal sigma of a step's time")
    p.add_argument("--warm", choices=("trace", "rejected"), default="rejected",
                   help="the warm-up's four 8-token requests: the trace's first tokens, or every "
                        "draft rejected (what the bench's warm-up taught on the H100)")
    p.add_argument("--half-lives", default=f"0,{AcceptanceModel.HALF_LIFE:g}",
                   help="AcceptanceModel half-lives to replay (0: outcomes never age)")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args()
    accepted, k_trace = read_fixed_trace(a.trace)
    m = matches_from_fixed_trace(accepted, k_trace, a.fill)
    step_ms = [float(x) for x in a.step_ms.split(",")]
    k_max = len(step_ms) - 1
    cal = calibration_from(step_ms)
    truth = lambda n, k: step_ms[k] * 1e-3   # noqa: E731 (batch 1 only)
    catchup = CostModel(cal).catchup_seconds
    out_len = min(a.output_len, len(m))
    print(f"{len(accepted)} steps at k = {k_trace}: {len(m)} token bits, "
          f"{sum(m) / len(m):.2f} ones; output {out_len} tokens")
    rng = random.Random(0)
    fixed = {k: replay(None, [m], out_len, k_max, truth, catchup, rng, 0.0, fixed=k).tok_per_s
             for k in range(k_max + 1)}
    best_k = max(range(1, k_max + 1), key=lambda k: fixed[k])
    print("fixed k tok/s: " + ", ".join(f"{k}: {v:.0f}" for k, v in fixed.items()))
    warm = [m[:9] if a.warm == "trace" else [0] * 9] * 4   # the bench's warm-up: 4 x 8 tokens
    res: dict = {"fixed": fixed, "best_fixed_k": best_k, "warm": a.warm, "half_lives": {}}
    for half_life in (float(h) for h in a.half_lives.split(",")):
        per_run = replay_cell(m, warm, out_len, k_max, cal, truth, catchup, half_life, a)
        res["half_lives"][half_life] = per_run
        print(f"half-life {half_life:g} steps, warm-up {a.warm}:")
        for r, v in enumerate(per_run):
            med = statistics.median(v)
            print(f"  adaptive run {r}: median {med:.0f} tok/s = {med / fixed[best_k]:.2f}x best "
                  f"fixed (k = {best_k}), {med / fixed[0]:.2f}x plain; min {min(v):.0f} max {max(v):.0f}")
        meds = [statistics.median(x) for x in zip(*per_run)]
        print(f"  the bench's cell (median of the {a.runs} runs), over {a.seeds} replays: median "
              f"{statistics.median(meds) / fixed[best_k]:.2f}x best fixed, worst "
              f"{min(meds) / fixed[best_k]:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(res))


def replay_cell(m: list[int], warm: list[list[int]], out_len: int, k_max: int, cal: Calibration,
                truth: Callable[[int, int], float], catchup: Callable[[int], float],
                half_life: float, a: argparse.Namespace) -> list[list[float]]:
    """tok/s of each of the cell's ``a.runs`` runs (after the warm-up), per replay seed."""
    per_run: list[list[float]] = [[] for _ in range(a.runs)]
    for seed in range(a.seeds):
        rng = random.Random(seed)
        ctl = KController(k_max, "adaptive", CostModel(cal), AcceptanceModel(k_max, half_life=half_life))
        replay(ctl, warm, len(warm[0]), k_max, truth, catchup, rng, a.noise, request_tag="w")
        for r in range(a.runs):
            res = replay(ctl, [m], out_len, k_max, truth, catchup, rng, a.noise, request_tag=f"s{r}-")
            per_run[r].append(res.tok_per_s)
    return per_run


if __name__ == "__main__":
    main()
