"""Record what scripts/adaptive_replay.py needs to replay the adaptive bench's T = 0 cells offline:
for every request of the cells (and of the warm-up), one bit per output token, whether the
truncated draft's greedy token there equals the target's; and the step time of each fixed k at
each batch size on this GPU.

A step that commits n tokens after verifying k drafts shows n - 1 ones and, if n - 1 < k, a
zero; after n - 1 == k the next bit is not seen. The runs at several fixed k start their steps
at different tokens, so together they see most bits; a bit is kept as first seen (the first k
listed) and each later run that saw it otherwise adds one to ``conflicts``. On the CPU (fp32)
every run makes the same greedy tokens and the runs agree. In bf16 on a GPU they need not: a
verification's width changes the rounding, the random-weight dummies have many near ties, and
once two runs pick different tokens their sequences, and bits, part. Then the bits are one run's
sample of the process (mostly the first k's), not the only possible path. Unseen counts include
each row's last position, which no step drafts.

    OUT=DIR PYTHONPATH=. python3 scripts/greedy_bits.py [--batches 1,16,64] [--ks 8,5,3,2,1,4,0]
        [--draft mid|unrelated] [--tiny]

Writes $OUT/greedy_bits.json: {"settings", "calibration", "warm": bits per request,
"cells": {batch: {"bits": per request, "unseen", "conflicts", "ones", "step_ms": {k: median},
"tok_per_s": {k}}}}. k = 0 is the same engine forced to k = 0; forced, it waits for the host
every step, where adaptive at k = 0 runs the next step ahead (adaptive_replay.py --plain-ms
takes the bench's plain step times instead).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import ContextManager

from specserve.bench import adaptive as ad
from specserve.bench.engines import random_prompts
from specserve.engine.core import EngineCore
from specserve.engine.spec_control import KController
from specserve.engine.types import SamplingParams

UNSEEN = -1


def forced(core: EngineCore, k: int) -> ContextManager[KController]:
    """Every row at ``k`` (0 included: the adaptive engine's plain steps, without running ahead)."""
    if k:
        return ad.fixed_k(core, k, {})
    ctl = KController(core.spec_control.k_max, "fixed", None)
    ctl.force = lambda row: 0
    return ad.swapped_controller(core, ctl)


def _put(row: list[int], i: int, bit: int) -> int:
    """Record a bit where no run saw it yet; 1 if an earlier run saw it otherwise (kept)."""
    if row[i] == UNSEEN:
        row[i] = bit
        return 0
    return int(row[i] != bit)


def run_fixed(core: EngineCore, prompts: list[list[int]], output_len: int, k: int, tag: str,
              bits: list[list[int]]) -> tuple[list[float], float, int]:
    """Generate at fixed ``k``, filling ``bits`` from each request's tokens per step (k > 0).
    Returns the decode steps' seconds, the decode tokens/s and the bits seen otherwise before."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    seconds: list[float] = []
    conflicts = 0
    done = {i: 0 for i in ids}            # output tokens seen so far
    tokens = decode_seconds = 0.0
    with forced(core, k):
        for rid, p in zip(ids, prompts):
            core.add_request(rid, p, params)
        while core.has_unfinished():
            outs, stats = core.step()
            decode = all(done[i] > 0 for i in ids) and stats.num_prompt_tokens == 0
            for out in outs:
                n_now = len(out.outputs[0].token_ids)
                i = ids.index(out.request_id)
                t, n = done[out.request_id], n_now - done[out.request_id]
                if t > 0 and n > 0 and k > 0:
                    # this step verified k drafts from token t, fewer near the end (where the
                    # count is not known exactly, a short run of ones says nothing)
                    row = bits[i]
                    for j in range(n - 1):
                        conflicts += _put(row, t + j, 1)
                    if n - 1 < k and t + k + 2 < output_len:
                        conflicts += _put(row, t + n - 1, 0)
                done[out.request_id] = n_now
            if decode:
                seconds.append(stats.step_seconds)
                tokens += stats.num_generation_tokens
                decode_seconds += stats.step_seconds
    return seconds, (tokens / decode_seconds if decode_seconds else 0.0), conflicts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--ks", default="8,5,3,2,1,4,0", help="fixed k to run (bits come from k > 0)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    p.add_argument("--draft", choices=("mid", "unrelated"), default="mid",
                   help="the draft (the bench's truncated one by default)")
    a = p.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in a.batches.split(",")]
    ks = [int(k) for k in a.ks.split(",")]
    s = ad.script_settings(batches, [0.0], ks=tuple(range(1, 9)))
    # checkpoints (configs and tokenizer, no weights) in a directory of this run's own: two runs
    # at once (a test beside a CI run on one machine) must not write each other's files
    dirs, cache = ad.script_models(Path(tempfile.mkdtemp(prefix="greedy_bits-")), s, a.tiny)
    core = ad.build_core(cache, dirs["target"], dirs[a.draft], s)
    vocab = core.info.vocab_size
    lengths = {b: s.output_len_for(b) for b in batches}
    res: dict = {"settings": {"batches": batches, "ks": ks, "output_len": lengths,
                              "prompt_len": s.prompt_len, "tiny": a.tiny},
                 "calibration": core.spec_control.controller.cost.cal.as_dict(), "cells": {}}
    warm = random_prompts(4, s.prompt_len, vocab, s.seed + 999)
    warm_bits = [[UNSEEN] * 9 for _ in warm]
    for k in ks:
        if k:
            run_fixed(core, warm, 8, k, f"warm-k{k}", warm_bits)
    res["warm"] = warm_bits
    for b in batches:
        prompts = random_prompts(b, s.prompt_len, vocab, s.seed + 1000 * b)
        n = s.output_len_for(b)
        bits = [[UNSEEN] * (n + 1) for _ in prompts]
        cell: dict = {"step_ms": {}, "tok_per_s": {}}
        conflicts = 0
        for k in ks:
            secs, tps, seen_otherwise = run_fixed(core, prompts, n, k, f"b{b}-k{k}", bits)
            conflicts += seen_otherwise
            cell["step_ms"][k] = round(statistics.median(secs) * 1e3, 4) if secs else None
            cell["tok_per_s"][k] = round(tps, 1)
            print(f"batch {b} k {k}: step {cell['step_ms'][k]} ms, {tps:,.1f} tok/s", flush=True)
        cell["bits"] = bits
        seen = [x for row in bits for x in row[1:n]]
        cell["unseen"] = sum(1 for x in seen if x == UNSEEN)
        cell["conflicts"] = conflicts
        cell["ones"] = round(sum(1 for x in seen if x == 1) / max(1, sum(1 for x in seen if x != UNSEEN)), 4)
        print(f"batch {b}: {len(seen)} bits, {cell['unseen']} unseen, {conflicts} seen otherwise by "
              "a later run, "
              f"ones {cell['ones']}", flush=True)
        res["cells"][b] = cell
    (out / "greedy_bits.json").write_text(json.dumps(res))
    print("wrote", out / "greedy_bits.json")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
