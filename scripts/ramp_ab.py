"""The adaptive bench's load ramp (batch 1 -> ~246 -> 1, T = 0, truncated-draft pair) alone,
several rounds, with each run's time split into the climb (until the batch first reaches its
peak less 3) and the descent, so a loss can be placed: decisions (adaptive against the same
engine held at k = 0, ``adaptive:held-zero``) or the adaptive engine's own k = 0 path (held-zero
against the plain engine). Every config runs once per round, in order; a ratio to plain pairs
the runs of one round.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/ramp_ab.py --rounds 5 --out /tmp/ramp
    python scripts/ramp_ab.py --tiny --rounds 1 --requests 24      # a CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from specserve.bench import adaptive as ad


def segments(trace: list, peak: int) -> tuple[float, float]:
    """(seconds of the climb, seconds of the descent) of a run's trace."""
    top = next((i for i, (_, r, _, _) in enumerate(trace) if r >= peak - 3), len(trace) - 1)
    return trace[top][0], trace[-1][0] - trace[top][0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds of every config")
    p.add_argument("--configs", default="plain,adaptive,adaptive:held-zero,k1,k2",
                   help="comma-separated: plain, adaptive, adaptive:<variant>, k<n>")
    p.add_argument("--temperature", type=float, default=0.0, help="the requests' temperature")
    p.add_argument("--requests", type=int, default=256, help="requests in the ramp")
    p.add_argument("--out", type=Path, default=None, help="write every run (with its trace) here as JSON")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(relativeCreated)7.0f ms] %(name)s: %(message)s")
    configs = a.configs.split(",")
    ks = sorted({int(c[1:]) for c in configs if c.startswith("k")} | {8})
    s = ad.script_settings((64,), (a.temperature,), ks=tuple(ks), ramp_requests=a.requests)
    dirs, cache = ad.script_models(Path("/tmp/ramp-ab-models"), s, a.tiny)
    plain = ad.build_core(cache, dirs["target"], None, s)
    core = ad.build_core(cache, dirs["target"], dirs["mid"], s)
    log = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    extra = ad.capture_exact_widths(core, tuple(k for k in ks if f"k{k}" in configs), log)
    names = tuple(c.split(":", 1)[1] for c in configs if c.startswith("adaptive:"))
    variants = ad.variant_controllers(core, names)
    engine = {c: plain if c == "plain" else core for c in configs}
    warm = ad.warm_ramp_settings(s)
    for c in configs:
        with ad._config(engine[c], c, extra, variants):
            ad.run_ramp(engine[c], warm, a.temperature, f"warm-{c}")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for rnd in range(a.rounds):
        for c in configs:
            with ad._config(engine[c], c, extra, variants):
                r = ad.run_ramp(engine[c], s, a.temperature, f"r{rnd}-{c}")
            r["climb_s"], r["descent_s"] = segments(r["trace"], r["peak_batch"])
            runs[c].append(r)
            print(f"round {rnd} {c:22s} {r['tok_per_s']:9.1f} tok/s  {r['seconds']:.3f}s = climb "
                  f"{r['climb_s']:.3f} + descent {r['descent_s']:.3f}  steps {r['steps']} "
                  f"(ahead {r['ahead_steps']})  rows per k {r['chosen_k']}", flush=True)
    print("\nmedians (ratios: median over rounds of each run / plain's run of the same round)")
    for c in configs:
        med = lambda key: statistics.median(r[key] for r in runs[c])   # noqa: E731
        line = (f"{c:22s} {med('tok_per_s'):9.1f} tok/s  climb {med('climb_s'):.3f}s  "
                f"descent {med('descent_s'):.3f}s")
        if "plain" in runs and c != "plain":
            ratio = statistics.median(r["tok_per_s"] / q["tok_per_s"]
                                      for r, q in zip(runs[c], runs["plain"]))
            line += f"  / plain {ratio:.3f}x"
        print(line)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "ramp_ab.json").write_text(json.dumps({"configs": configs, "runs": runs,
                                                        "when": time.time()}, indent=1))


if __name__ == "__main__":
    main()
