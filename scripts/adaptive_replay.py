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
prints tokens/s of every run against every fixed k on the same bits. ``--bits`` reads bits and
step times of the bench's batch sizes recorded on a GPU by scripts/greedy_bits.py instead.

Where it is simpler than the engine: a step decides k, verifies k and pays for k (the engine
verifies the drafts the step before proposed, so a change of k costs a mixed step); a prompt
that arrives while the controller is at k = 0 leaves the draft behind by its length (as the
engine does), and no prefill step is modelled; a step's time is the cell's measured time at k,
scaled to a smaller batch by the calibration's device times, with log-normal noise and no host
effects; the cost model runs ahead at k = 0 as on the GPU but is never told hidden host time;
no request ever waits for a row, so the controller always prices a static batch's end.

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
                                           Row, _interp, generation_phase, temperature_bucket)

WARM_TOKENS = 8      # the bench's warm-up: four requests of 8 tokens (max_tokens 8)
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
    """(accepted per step, k) of the first fixed-k run in an adaptive_decisions.py log, up to its
    first step that verified fewer than k (its end: the bits after it would be misplaced)."""
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if re.search(rf"-{label}(\d+):", ln))
    k = int(re.search(rf"-{label}(\d+):", lines[start]).group(1))
    accepted = []
    for ln in lines[start + 1:]:
        f = ln.split()
        if len(f) < 6 or not f[0].isdigit():
            break
        drafts, tokens = int(f[3]), int(f[5])
        if drafts != k:
            break
        accepted.append(tokens - 1)
    return accepted, k


def run_length(m: list[int], t: int, k: int) -> int:
    """Drafts a step at token t with k drafts accepts: the leading ones of m[t:t + k]."""
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
           request_tag: str = "r", prompt_len: int = 32) -> RunResult:
    """One cell: len(matches) requests decode ``output_len`` tokens together at T = 0, with
    ``ctl`` choosing k, or every step at ``fixed`` (``ctl`` is then not consulted)."""
    b = len(matches)
    adaptive = ctl is not None and fixed is None
    pos = [1] * b                        # output tokens committed (the prefill made the first)
    # tokens the draft's KV has not seen: a prompt admitted at k = 0 is not fed to the draft
    lag = [prompt_len if adaptive and ctl.current == 0 else 0] * b
    ids = [f"{request_tag}{i}" for i in range(b)]
    bucket = temperature_bucket(0.0)
    seconds, steps, chosen = 0.0, 0, [0] * (k_max + 1)
    while any(p < output_len for p in pos):
        live = [i for i in range(b) if pos[i] < output_len]
        n = len(live)
        budget = {i: max(0, min(k_max, output_len - pos[i] - 1)) for i in live}
        if not adaptive:
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
                lag[i] += 1
            pos[i] += 1 + a
            tokens += 1 + a
            chosen[ks[i]] += 1
        if adaptive:
            if verified:
                ctl.acceptance.record_step(verified)
            ctl.observe_step(n, k, k, tokens, t)
        seconds += t
        steps += 1
    if adaptive:
        for i in ids:
            ctl.acceptance.forget(i)
    return RunResult(sum(p - 1 for p in pos), seconds, steps, chosen)


def calibration_from(step_ms: list[float]) -> Calibration:
    """A batch-1 calibration whose widths reproduce ``step_ms`` (target part: the plain step;
    the rest as draft passes), as start-up would measure it; the draft's catch-up costs are
    call 9's H100 calibration (docs/bench-h100/draft-profile/call9_h100_decisions_b1_t0.log)."""
    plain = step_ms[0] * 1e-3
    draft = [(s - step_ms[0]) * 1e-3 / max(k, 1) for k, s in enumerate(step_ms)][1:]
    d = statistics.median(draft)
    widths = list(range(1, len(step_ms) + 1))
    target = [plain + max(0.0, (step_ms[w - 1] * 1e-3 - plain) - (w - 1) * d) for w in widths]
    return Calibration([1], widths, [target], [d], padded=True, catchup_token=1.26e-6,
                       catchup_fixed=2e-3, catchup_graph_tokens=1024, catchup_graph_token=1.26e-6,
                       catchup_graph_fixed=4.7e-4)


@dataclass
class Cell:
    """One batch size's requests: their bits, their length and the measured step time by k."""

    batch: int
    rows: list[list[int]]
    output_len: int
    step_ms: list[float]           # k = 0 .. k_max


def _fill(bits: list[int], fill: int) -> list[int]:
    return [fill if x < 0 else x for x in bits]


def _interp_ms(step_ms: dict, k_max: int) -> list[float]:
    """Step ms for k = 0 .. k_max from the fixed k measured (linear in k between them)."""
    known = sorted((int(k), v) for k, v in step_ms.items() if v is not None)
    ks, ms = [k for k, _ in known], [v for _, v in known]
    return [_interp(ks, ms, k, padded=False) for k in range(k_max + 1)]


def load_bits(path: Path, fill: int, k_max: int) -> tuple[list[Cell], list[list[int]], Calibration]:
    """The cells, the warm-up's bits and the start-up calibration from scripts/greedy_bits.py."""
    d = json.loads(path.read_text())
    c = d["calibration"]
    cal = Calibration(c["batches"], c["widths"], c["target_seconds"], c["draft_pass_seconds"],
                      c["padded"], c.get("calibration_seconds", 0.0), c["catchup_seconds_per_token"],
                      c["catchup_seconds_fixed"], c["catchup_graph_tokens"],
                      c["catchup_graph_seconds_per_token"], c["catchup_graph_seconds_fixed"])
    cells = [Cell(int(b), [_fill(r, fill) for r in cell["bits"]], d["settings"]["output_len"][b],
                  _interp_ms(cell["step_ms"], k_max)) for b, cell in d["cells"].items()]
    return cells, [_fill(r, fill)[:WARM_TOKENS] for r in d["warm"]], cal


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--bits", type=Path, help="scripts/greedy_bits.py's JSON: every cell, its "
                     "warm-up and its step times")
    src.add_argument("--trace", type=Path, help="adaptive_decisions.py log with a fixed-k run "
                     "(batch 1 only, with --step-ms)")
    p.add_argument("--fill", type=int, default=1, help="the unobserved bit after a fully accepted step")
    p.add_argument("--step-ms", default=",".join(map(str, H100_MID_B1_MS)),
                   help="with --trace: measured batch-1 step ms at k = 0 .. k_max")
    p.add_argument("--output-len", type=int, default=128, help="with --trace: tokens per request")
    p.add_argument("--plain-ms", default="", help="with --bits: batch:ms,... a k = 0 step's time "
                   "where adaptive runs it ahead of the host (the bench's no-spec cells), in place of "
                   "greedy_bits.py's forced k = 0, which waits for the host")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--runs", type=int, default=3, help="adaptive runs of each cell on one controller")
    p.add_argument("--seeds", type=int, default=20, help="replays (step-time noise seeds)")
    p.add_argument("--noise", type=float, default=0.03, help="log-normal sigma of a step's time")
    p.add_argument("--warm", choices=("recorded", "rejected"), default="recorded",
                   help="the warm-up's four 8-token requests: their recorded bits (--bits; with "
                        "--trace the trace's first tokens), or every draft rejected")
    p.add_argument("--warm-tokens", type=int, default=WARM_TOKENS,
                   help="tokens per warm-up request (the bench's: 8); with --warm rejected one more "
                        "is one more rejected verification per request")
    p.add_argument("--half-lives", default="0,128",
                   help="AcceptanceModel half-lives to replay (0: outcomes never age)")
    p.add_argument("--probe-shares", default=str(KController.PROBE_SHARE_MAX),
                   help="KController probe_share_max values to replay (0: probes on the schedule only)")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args()
    if a.bits:
        cells, warm, cal = load_bits(a.bits, a.fill, a.k_max)
    else:
        accepted, k_trace = read_fixed_trace(a.trace)
        m = matches_from_fixed_trace(accepted, k_trace, a.fill)
        step_ms = [float(x) for x in a.step_ms.split(",")]
        cal = calibration_from(step_ms)
        cells = [Cell(1, [m], min(a.output_len, len(m)), step_ms)]
        warm = [m[:WARM_TOKENS]] * 4
        print(f"{len(accepted)} steps at k = {k_trace}: {len(m)} token bits, {sum(m) / len(m):.2f} ones")
    for item in filter(None, a.plain_ms.split(",")):
        b, ms = item.split(":")
        for cell in cells:
            if cell.batch == int(b):
                cell.step_ms[0] = float(ms)
    if a.warm == "rejected":
        warm = [[0] * a.warm_tokens for _ in warm]
    k_max = len(cells[0].step_ms) - 1
    cost = CostModel(cal)
    catchup = cost.catchup_seconds
    res: dict = {"warm": a.warm, "cells": {}}
    fixed_by_cell = {}
    for cell in cells:
        truth = _truth(cell, cost)
        fixed = {k: replay(None, cell.rows, cell.output_len, k_max, truth, catchup,
                           random.Random(0), 0.0, fixed=k).tok_per_s for k in range(k_max + 1)}
        fixed_by_cell[cell.batch] = fixed
        ones = sum(sum(r[1:cell.output_len]) for r in cell.rows) / sum(cell.output_len - 1 for _ in cell.rows)
        print(f"batch {cell.batch}: {len(cell.rows)} requests of {cell.output_len} tokens, ones {ones:.2f}; "
              "fixed k tok/s " + ", ".join(f"{k}: {v:,.0f}" for k, v in fixed.items()))
    settings = [(float(h), float(ps)) for h in a.half_lives.split(",") for ps in a.probe_shares.split(",")]
    for half_life, share in settings:
        per_cell = replay_bench(cells, warm, k_max, cal, catchup, half_life, share, a)
        print(f"half-life {half_life:g} steps, probe share {share:g}, warm-up {a.warm}:")
        for cell in cells:
            fixed, per_run = fixed_by_cell[cell.batch], per_cell[cell.batch]
            best_k = max(range(1, k_max + 1), key=lambda k: fixed[k])
            meds = [statistics.median(x) for x in zip(*per_run)]
            med = statistics.median(meds)
            print(f"  batch {cell.batch}: cell (median of {a.runs} runs) {med:,.0f} tok/s = "
                  f"{med / fixed[best_k]:.2f}x best fixed (k = {best_k}), {med / fixed[0]:.2f}x "
                  f"plain over {a.seeds} replays; worst {min(meds) / fixed[best_k]:.2f}x / "
                  f"{min(meds) / fixed[0]:.2f}x; runs " + ", ".join(
                      f"{statistics.median(v) / fixed[0]:.2f}" for v in per_run) + "x plain")
            res["cells"].setdefault(cell.batch, {"fixed": fixed})[f"{half_life:g}/{share:g}"] = per_run
    if a.json:
        a.json.write_text(json.dumps(res))


def _truth(cell: Cell, cost: CostModel) -> Callable[[int, int], float]:
    """A step's seconds: the cell's measured time at k, at a smaller batch (its rows finishing,
    or the warm-up's four) scaled by the calibration's device times."""
    def seconds(n: int, k: int) -> float:
        scale = cost.device_seconds(n, k, k) / cost.device_seconds(cell.batch, k, k)
        return cell.step_ms[k] * 1e-3 * scale
    return seconds


def replay_bench(cells: list[Cell], warm: list[list[int]], k_max: int, cal: Calibration,
                 catchup: Callable[[int], float], half_life: float, probe_share: float,
                 a: argparse.Namespace) -> dict[int, list[list[float]]]:
    """The bench's order on one controller per seed: the warm-up, then each cell ``a.runs``
    times. Returns {batch: tok/s of each run, per seed}."""
    out = {c.batch: [[] for _ in range(a.runs)] for c in cells}
    scale = CostModel(cal)
    for seed in range(a.seeds):
        rng = random.Random(seed)
        # decode-ahead runs plain steps ahead on the GPU: the engine's cost model knows it
        ctl = KController(k_max, "adaptive", CostModel(cal, zero_runs_ahead=True),
                          AcceptanceModel(k_max, half_life=half_life), probe_share_max=probe_share)
        replay(ctl, warm, len(warm[0]), k_max, _truth(cells[0], scale), catchup, rng, a.noise,
               request_tag="w")
        for cell in cells:
            for r in range(a.runs):
                res = replay(ctl, cell.rows, cell.output_len, k_max, _truth(cell, scale), catchup,
                             rng, a.noise, request_tag=f"b{cell.batch}-{r}-")
                out[cell.batch][r].append(res.tok_per_s)
    return out


if __name__ == "__main__":
    main()
