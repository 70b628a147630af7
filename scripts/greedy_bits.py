"""Record what scripts/adaptive_replay.py needs to replay the adaptive bench's T = 0 cells offline:
for every request of the cells (and of the warm-up), one bit per output token, whether the
truncated draft's greedy token there equals the target's; and the step times of each fixed k at
each batch size on this GPU.

Greedy output is the target's whatever k is, so every fixed-k run sees the same tokens and the
same bits. A step that commits n tokens after verifying k drafts shows n - 1 ones and, if
n - 1 < k, a zero; after n - 1 == k the next bit is not seen. Runs at several fixed k start
their steps at different tokens, so together they leave few bits unseen (reported; the replay
fills them).

    OUT=DIR PYTHONPATH=. python3 scripts/greedy_bits.py [--batches 1,16,64] [--ks 8,5,3,2,1,4]
        [--tiny]

Writes $OUT/greedy_bits.json: {"settings", "calibration", "warm": bits per request,
"cells": {batch: {"bits": per request, "unseen": count, "step_ms": {k: median}, "tok_per_s": {k}}}}
(k = 0 is the same engine forced to k = 0, as adaptive runs it).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
from pathlib import Path
from typing import Optional

from specserve.bench import adaptive as ad
from specserve.bench.engines import random_prompts
from specserve.engine.spec_control import KController
from specserve.engine.types import SamplingParams

UNSEEN = -1


def forced(core, k: int):
    """Every row at ``k`` (0 included: the adaptive engine's own plain steps)."""
    if k:
        return ad.fixed_k(core, k, {})
    ctl = KController(core.spec_control.k_max, "fixed", None)
    ctl.force = lambda row: 0
    return ad.swapped_controller(core, ctl)


def _put(row: list[int], i: int, bit: int, conflicts: list[int]) -> None:
    """Record a bit; one that another run saw otherwise (the GPU's rounding can move a near
    tie) is counted in ``conflicts`` and the first value kept."""
    if row[i] == UNSEEN:
        row[i] = bit
    elif row[i] != bit:
        conflicts[0] += 1


def run_fixed(core, prompts: list[list[int]], output_len: int, k: int, tag: str,
              bits: Optional[list[list[int]]], conflicts: list[int]) -> tuple[list[float], float]:
    """Generate at fixed ``k``; fill ``bits`` from each request's tokens per step. Returns the
    decode steps' seconds and the decode tokens/s."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    seconds: list[float] = []
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
                if bits is not None and t > 0 and n > 0 and k > 0:
                    # this step verified k drafts from token t, fewer near the end (where the
                    # count is not known exactly, a short run of ones says nothing)
                    row = bits[i]
                    for j in range(n - 1):
                        _put(row, t + j, 1, conflicts)
                    if n - 1 < k and t + k + 2 < output_len:
                        _put(row, t + n - 1, 0, conflicts)
                done[out.request_id] = n_now
            if decode:
                seconds.append(stats.step_seconds)
                tokens += stats.num_generation_tokens
                decode_seconds += stats.step_seconds
    return seconds, (tokens / decode_seconds if decode_seconds else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--ks", default="8,5,3,2,1,4,0", help="fixed k to run (bits come from k > 0)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    p.add_argument("--draft", choices=("mid", "unrelated"), default="mid", help="the draft (the bench's truncated one by default)")
    a = p.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in a.batches.split(",")]
    ks = [int(k) for k in a.ks.split(",")]
    s = ad.script_settings(batches, [0.0], ks=tuple(range(1, 9)))
    dirs, cache = ad.script_models(Path("/tmp/greedy_bits"), s, a.tiny)
    core = ad.build_core(cache, dirs["target"], dirs[a.draft], s)
    vocab = core.info.vocab_size
    res: dict = {"settings": {"batches": batches, "ks": ks, "output_len": {b: s.output_len_for(b) for b in batches},
                              "prompt_len": s.prompt_len, "tiny": a.tiny},
                 "calibration": core.spec_control.controller.cost.cal.as_dict(), "cells": {}}
    warm = random_prompts(4, s.prompt_len, vocab, s.seed + 999)
    warm_bits = [[UNSEEN] * 9 for _ in warm]
    for k in ks:
        if k:
            run_fixed(core, warm, 8, k, f"warm-k{k}", warm_bits, [0])
    res["warm"] = warm_bits
    for b in batches:
        prompts = random_prompts(b, s.prompt_len, vocab, s.seed + 1000 * b)
        n = s.output_len_for(b)
        bits = [[UNSEEN] * (n + 1) for _ in prompts]
        cell: dict = {"step_ms": {}, "tok_per_s": {}}
        conflicts = [0]
        for k in ks:
            secs, tps = run_fixed(core, prompts, n, k, f"b{b}-k{k}", bits, conflicts)
            cell["step_ms"][k] = round(statistics.median(secs) * 1e3, 4) if secs else None
            cell["tok_per_s"][k] = round(tps, 1)
            print(f"batch {b} k {k}: step {cell['step_ms'][k]} ms, {tps:,.1f} tok/s", flush=True)
        cell["bits"] = bits
        seen = [x for row in bits for x in row[1:n]]
        cell["unseen"] = sum(1 for x in seen if x == UNSEEN)
        cell["conflicts"] = conflicts[0]
        cell["ones"] = round(sum(1 for x in seen if x == 1) / max(1, sum(1 for x in seen if x != UNSEEN)), 4)
        print(f"batch {b}: {len(seen)} bits, {cell['unseen']} unseen, {conflicts[0]} seen both ways, "
              f"ones {cell['ones']}", flush=True)
        res["cells"][b] = cell
    (out / "greedy_bits.json").write_text(json.dumps(res))
    print("wrote", out / "greedy_bits.json")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
