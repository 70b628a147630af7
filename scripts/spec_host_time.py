"""The adaptive controller's own host work per step, on the CPU machine: a tiny adaptive engine
(section adaptive's truncated-draft pair at tiny shapes) held at k = 0 (or, with ``--k``,
drafting: adaptive as it decides, or a fixed k), its SpecControl calls timed one by one over
200 decode steps at the given batch. Microseconds per step.

    python scripts/spec_host_time.py [--batch 64] [--k held|adaptive|N] [--temperature 1]
"""
from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from specserve.bench import adaptive as ad
from specserve.bench.engines import random_prompts
from specserve.engine import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64, help="requests decoding together")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps")
    p.add_argument("--k", default="held", help="held (at k = 0), adaptive (deciding every step) "
                   "or a fixed k for every row")
    p.add_argument("--temperature", type=float, default=0.0, help="the requests' temperature")
    a = p.parse_args()
    s = ad.script_settings((a.batch,), (a.temperature,))
    dirs, cache = ad.script_models(Path(tempfile.mkdtemp(prefix="spec-host-time-")), s, True)
    core = ad.build_core(cache, dirs["target"], dirs["mid"], s)
    sc, ctl = core.spec_control, core.spec_control.controller
    if a.k == "held":
        ad.hold_at_zero(ctl)
    elif a.k != "adaptive":
        ctl.force = lambda row, k=int(a.k): k
    spent: collections.Counter = collections.Counter()

    def timed(obj, name: str) -> None:
        f = getattr(obj, name)

        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
        setattr(obj, name, run)

    for name in ("plan", "committed", "prepare_next", "after_step"):
        timed(sc, name)
    for name in ("decide", "observe_step"):
        timed(ctl, name)
    for rid, prompt in zip(range(a.batch), random_prompts(a.batch, 32, core.info.vocab_size, 7)):
        core.add_request(f"r{rid}", prompt, SamplingParams(temperature=a.temperature, max_tokens=400, ignore_eos=True))
    for _ in range(12):
        core.step()
    spent.clear()
    for _ in range(a.steps):
        core.step()
    total = sum(spent[n] for n in ("plan", "committed", "prepare_next", "after_step"))
    mean_k = ad.mean_k(ctl.chosen_counts) or 0.0
    print(f"batch {a.batch}, k {a.k} (mean chosen {mean_k:.2f}), T = {a.temperature:g}: " + ", ".join(f"{n} {v / a.steps * 1e6:.1f}" for n, v in spent.items())
          + f" us a step; plan + committed + prepare_next + after_step {total / a.steps * 1e6:.1f} us "
          "(decide inside plan or prepare_next, observe_step inside after_step)")


if __name__ == "__main__":
    main()
