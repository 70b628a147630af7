"""Per-row host work of one decode step, timed warm on a captured step: the bench's adaptive
engine (truncated-draft pair, tiny shapes) held at k = 0 runs a batch a few steps, the last
step's scheduled rows and stats are kept, and each per-row function is called on them in a loop
(microseconds a call). Warm timings of the functions alone, without the forward between steps
that on the CPU machine evicts their data from the caches and makes in-engine timings noisy.

    PYTHONPATH=. python3 scripts/host_row_micro.py [--batch 256] [--calls 2000]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

from specserve.bench import adaptive as ad
from specserve.bench.engines import random_prompts
from specserve.engine import SamplingParams
from specserve.engine.batch import still_running
from specserve.engine.runner.speculator import nothing_to_draft


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256, help="requests decoding together")
    p.add_argument("--calls", type=int, default=2000, help="calls timed per function")
    a = p.parse_args()
    s = ad.script_settings((a.batch,), (0.0,))
    dirs, cache = ad.script_models(Path(tempfile.mkdtemp(prefix="host-row-micro-")), s, True)
    core = ad.build_core(cache, dirs["target"], dirs["mid"], s)
    sc, ctl = core.spec_control, core.spec_control.controller
    ad.hold_at_zero(ctl)
    for rid, prompt in zip(range(a.batch), random_prompts(a.batch, 32, core.info.vocab_size, 7)):
        core.add_request(f"r{rid}", prompt, SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True))
    captured: dict = {}
    after_step = sc.after_step

    def capture(scheduled, stats, decision=None):
        captured["step"] = (scheduled, stats, decision)
        return after_step(scheduled, stats, decision)

    sc.after_step = capture
    for _ in range(14):
        core.step()
    sc.after_step = after_step
    scheduled, stats, decision = captured["step"]
    parents = list(core._parents.values())
    rows = sc._rows(scheduled)

    def timed(name: str, fn: Callable[[], object], calls: int) -> None:
        fn()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        print(f"{name:34s} {(time.perf_counter() - t) / calls * 1e6:9.1f} us", flush=True)

    print(f"batch {a.batch}, held at k = 0; microseconds a call over the step's rows")
    timed("SpecControl.after_step", lambda: after_step(scheduled, stats, decision), a.calls)
    timed("SpecControl.committed", lambda: sc.committed(scheduled), a.calls)
    timed("CostModel.observe", lambda: ctl.cost.observe(a.batch, 0, 0, 5e-3, 1e-3, 4e-3), a.calls)
    timed("SpecControl._rows (full evaluation)", lambda: sc._rows(scheduled), a.calls // 10)
    timed("KController.decide (full evaluation)", lambda: ctl.decide(rows), a.calls // 10)
    timed("still_running", lambda: still_running(scheduled), a.calls)
    timed("nothing_to_draft", lambda: nothing_to_draft(scheduled), a.calls)
    timed("KVCacheManager.fits", lambda: core.kv.fits((s.request, s.num_computed_before + 6)
                                                       for s in scheduled), a.calls)
    timed("EngineCore._output, every request", lambda: [core._output(q) for q in parents], a.calls // 10)


if __name__ == "__main__":
    main()
