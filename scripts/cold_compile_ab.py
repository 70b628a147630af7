"""The sampler's cold start-up compile on the GPU, on an empty Triton cache of its own: the
warm-up in this process alone (``--mode serial``, as before kernels/precompile.py), or the same
calls split over worker processes and then this process's warm-up reading what they left
(``--mode workers``). One mode per process: a process keeps the kernels it compiled in memory.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/cold_compile_ab.py --mode serial --max-reqs 64 --max-drafts 4
    PYTHONPATH=/tmp/site:$PWD python3 scripts/cold_compile_ab.py --mode workers --max-reqs 64 --max-drafts 4
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

from specserve.kernels.precompile import SamplingWarmUp, compile_in_workers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary size")
    p.add_argument("--max-reqs", type=int, default=64, help="--max-num-seqs of the server")
    p.add_argument("--max-drafts", type=int, default=4, help="k_max (0: no speculation)")
    p.add_argument("--workers", type=int, default=8, help="compile worker processes")
    p.add_argument("--trace", action="store_true",
                   help="with scripts/compile_trace on PYTHONPATH and SPECSERVE_COMPILE_TRACE set: "
                        "after the run, the server-side compiles that missed the workers' cache "
                        "beside the workers' compiles of the same kernel and constexprs")
    p.add_argument("--mode", choices=("serial", "workers"), required=True,
                   help="compile in this process alone, or in workers first")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    job = SamplingWarmUp(a.vocab, a.max_reqs, a.max_drafts, "probabilistic", a.max_drafts > 0,
                         a.max_drafts > 0, "bfloat16", "cuda:0")
    print(f"job: {job}", flush=True)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-{a.mode}-")
    if a.mode == "serial":
        t0 = time.monotonic()
        calls = job.run()
        print(f"in this process alone: {calls} warm-up calls in {time.monotonic() - t0:.1f}s",
              flush=True)
        return
    t0 = time.monotonic()
    ok = compile_in_workers(job, a.workers)
    workers_s = time.monotonic() - t0
    t1 = time.monotonic()
    calls = job.run()
    read_s = time.monotonic() - t1
    print(f"{a.workers} workers: {workers_s:.1f}s (all finished: {ok}), then the server's warm-up "
          f"({calls} calls) {read_s:.1f}s from their cache: {workers_s + read_s:.1f}s in all",
          flush=True)
    if a.trace:
        explain_misses(os.environ["SPECSERVE_COMPILE_TRACE"])


def explain_misses(path: str) -> None:
    import json
    lines = [json.loads(x) for x in open(path)]
    me = os.getpid()
    mine = [x for x in lines if x["pid"] == me]
    theirs = [x for x in lines if x["pid"] != me]
    misses = [x for x in mine if not x["hit"]]
    print(f"trace: {len(theirs)} compiles in workers, {len(mine)} here, {len(misses)} of them missed")
    fields = ("attrs", "signature", "fn_key", "constants")
    for x in misses[:6]:
        same = [y for y in theirs if y["name"] == x["name"] and y["constants"] == x["constants"]]
        print(f"MISS {x['name']} {x['constants'][:300]}")
        for f in fields:
            print(f"  here   {f}: {x[f][:600]}")
        for y in same[:2]:
            diff = [f for f in fields if y[f] != x[f]]
            print(f"  worker {y['pid']} differs in {diff}")
            for f in diff:
                print(f"  worker {f}: {y[f][:600]}")
        if not same:
            print("  no worker compiled this kernel with these constexprs")


if __name__ == "__main__":
    main()
