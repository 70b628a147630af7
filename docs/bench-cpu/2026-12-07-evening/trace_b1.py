"""Fresh demo adaptive engines at batch 1: per-step decisions, to find the runs that stall at k<=1."""
import json, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import adaptive_cpu as ac
from specserve.engine.core import EngineCore
from specserve.engine.llm import make_config

common = dict(device="cpu", dtype="float32", max_num_seqs=1, seed=0)
runs = int(sys.argv[1]); out = []
for e in range(runs):
    core = EngineCore(make_config("demo", draft_model="demo", num_speculative_tokens=4, speculative_k="adaptive", **common))
    ctl = core.spec_control.controller
    steps = []
    def cb(stats):
        d = ctl.last
        cost = ctl.cost
        steps.append({"k": d.k, "gp": [round(g, 1) for g in (d.goodput or [])],
                      "sec": [round(1e3 * cost.step_seconds(1, k), 2) for k in range(5)],
                      "meas": [cost.samples(1, k) for k in range(5)],
                      "acc": stats.spec_decode.num_accepted_tokens if stats.spec_decode else None})
    from specserve.bench.engines import run_generation
    t = []
    run_generation(core, ac.prompts(core.tokenizer, 1), 8, "w", on_decode_step=cb)
    for r in range(5):
        g = run_generation(core, ac.prompts(core.tokenizer, 1), 128, f"r{r}", on_decode_step=cb)
        t.append(round(g.decode_tok_per_s, 1))
    counts = list(ctl.chosen_counts)
    print(e, "tok/s", t, "chosen", counts, "snapshot", json.dumps(core.spec_control.controller.acceptance.snapshot()["greedy"])[:600], flush=True)
    out.append({"tps": t, "counts": counts, "steps": steps, "cells": {f"{b},{k}": v.value for (b, k), v in ctl.cost.cells.items()}})
    json.dump(out, open("trace.json", "w"))
