"""Why adaptive k chose what it chose: the bench's adaptive engines (Qwen3-1.7B-like dummy target,
section adaptive's settings; the truncated draft by default, ``--pairs`` for the unrelated draft,
the self-draft or no draft) run their adaptive cells at the given batches and temperatures, three times each like
the bench, and record for every decode step: wall ms, the host share, k verified and k proposed,
committed tokens, target and draft ms, and the controller's predicted step ms and goodput for
every k. Each cell ends with the cost model's and the acceptance model's snapshot. Prints one line
per step of each cell's last repeat and writes $OUT/decisions.json.

    OUT=DIR PYTHONPATH=. python3 scripts/adaptive_decisions.py [--pairs mid,unrelated,none]
        [--batches 1,16] [--temps 0,1] [--repeats 3] [--tiny]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from pathlib import Path

from specserve.bench import adaptive as ad
from specserve.bench.engines import free_device_memory, random_prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default="mid", help="drafts (comma-separated): mid (the truncated "
                   "target), unrelated (the 0.6B-like dummy), self (the target), none (plain decoding)")
    p.add_argument("--batches", default="1,16", help="batch sizes (comma-separated)")
    p.add_argument("--temps", default="0,1", help="temperatures (comma-separated)")
    p.add_argument("--repeats", type=int, default=3, help="adaptive runs per cell")
    p.add_argument("--fixed-ks", default="", help="fixed k (comma-separated) to trace after each "
                   "cell's adaptive runs, one run each, for step-by-step comparison")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    fixed = tuple(int(k) for k in a.fixed_ks.split(",") if k)
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    s = ad.script_settings([int(b) for b in a.batches.split(",")],
                           [float(t) for t in a.temps.split(",")])
    dirs, cache = ad.script_models(Path("/tmp/decisions"), s, a.tiny)
    res: dict = {"calibration": {}, "cells": {}}
    for pair in a.pairs.split(","):
        draft = None if pair == "none" else dirs["target"] if pair == "self" else dirs[pair]
        core = ad.build_core(cache, dirs["target"], draft, s)
        run_cells(core, s, a.repeats, pair, res, fixed if pair != "none" else ())
        core = None   # the last reference, so that the engine is freed before the next one
        free_device_memory(cache.device)
    (out / "decisions.json").write_text(json.dumps(res))


def run_cells(core, s: ad.AdaptiveSettings, repeats: int, pair: str, res: dict,
              fixed: tuple[int, ...] = ()) -> None:
    ctl = core.spec_control.controller if core.spec_control is not None else None
    cost = ctl.cost if ctl is not None else None
    if cost is not None:
        res["calibration"][pair] = cost.cal.as_dict()
        print(pair, "calibration", json.dumps(cost.cal.as_dict()), flush=True)
    vocab = core.info.vocab_size
    for t in s.temperatures:
        ad.generate(core, random_prompts(4, s.prompt_len, vocab, 999), t, 8, f"warm-{t}")
        for b in s.batch_sizes:
            prompts = random_prompts(b, s.prompt_len, vocab, 1000 * b)
            # (key, fixed k or None for adaptive): adaptive's repeats, then each fixed k once
            runs = [(f"{pair}-T{t:g}-B{b}-r{rep}", None) for rep in range(repeats)]
            runs += [(f"{pair}-T{t:g}-B{b}-fixed{k}", k) for k in fixed]
            for key, k_fixed in runs:
                steps: list = []

                def on_step(st, batch=b, adaptive=k_fixed is None) -> None:
                    # (a fixed run swaps in its own controller: the adaptive one's last decision
                    # is stale then, so its goodput is not recorded)
                    last = ctl.last if ctl is not None and adaptive else None
                    steps.append({
                        "ms": round(st.step_seconds * 1e3, 3),
                        "host_ms": None if st.host_wait_seconds is None else
                        round((st.step_seconds - st.host_wait_seconds) * 1e3, 3),
                        "drafts": st.spec_decode.num_draft_tokens,
                        "k_next": st.max_chosen_k,
                        "tokens": st.num_generation_tokens,
                        "target_ms": round(st.target_seconds * 1e3, 3),
                        "draft_ms": round(st.draft_seconds * 1e3, 3),
                        "pred_ms": [round(cost.step_seconds(batch, k) * 1e3, 3)
                                    for k in range(ctl.k_max + 1)] if cost is not None else None,
                        "goodput": [round(g) for g in last.goodput] if last and last.goodput else None})

                controller = contextlib.nullcontext() if k_fixed is None else ad.fixed_k(core, k_fixed, {})
                with controller, gc_pauses() as pauses:
                    run = ad.run_generation(core, prompts, s.output_len_for(b), f"d-{key}",
                                            temperature=t, on_decode_step=on_step)
                print(f"  gc: {len(pauses)} collections, {sum(pauses) * 1e3:.1f} ms "
                      f"(longest {max(pauses, default=0.0) * 1e3:.1f} ms)")
                res["cells"][key] = {"tok_per_s": run.decode_tok_per_s, "steps": steps,
                                     "cost": cost.snapshot() if cost is not None else None,
                                     "acceptance": ctl.acceptance.snapshot() if ctl is not None else None}
                print(f"{key}: {run.decode_tok_per_s:,.1f} tok/s, {len(steps)} decode steps, "
                      f"acceptance {run.spec.acceptance_length}", flush=True)
                print_plain_summary(steps)
                print_steps(steps)
            snap = res["cells"][key]
            if snap["cost"] is not None:
                print("  cost", json.dumps({k: v for k, v in snap["cost"].items() if k != "calibration"}))
                print("  acceptance", json.dumps(snap["acceptance"]), flush=True)


@contextlib.contextmanager
def gc_pauses():
    """Seconds of each garbage collection while the block runs."""
    pauses: list[float] = []
    started: list[float] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def print_plain_summary(steps: list) -> None:
    """The plain steps (no drafts verified or proposed): wall ms at the median, p90 and max, and
    the median host and target ms, to set beside a plain engine's steps."""
    plain = [st for st in steps if not (st["drafts"] or st["k_next"])]
    if not plain:
        return
    ms = [st["ms"] for st in plain]
    host = [st["host_ms"] for st in plain if st["host_ms"] is not None]
    print(f"  plain steps: {len(plain)}, ms p50 {_quantile(ms, 0.5):.3f} p90 {_quantile(ms, 0.9):.3f} "
          f"max {max(ms):.3f}, host p50 {_quantile(host, 0.5):.3f}, "
          f"target p50 {_quantile([st['target_ms'] for st in plain], 0.5):.3f}", flush=True)


def print_steps(steps: list) -> None:
    """Every step that verified or proposed drafts or took over twice the median step; the plain
    steps between them as one count line."""
    ms = sorted(st["ms"] for st in steps)
    slow = 2 * ms[len(ms) // 2] if ms else 0.0
    quiet = 0
    for i, st in enumerate(steps):
        if not (st["drafts"] or st["k_next"] or st["ms"] > slow):
            quiet += 1
            continue
        if quiet:
            print(f"   ({quiet} plain steps)")
            quiet = 0
        print("  ", i, st["ms"], st["host_ms"], st["drafts"], st["k_next"], st["tokens"],
              st["target_ms"], st["draft_ms"], st["pred_ms"], st["goodput"], flush=True)
    if quiet:
        print(f"   ({quiet} plain steps)")


if __name__ == "__main__":
    main()
