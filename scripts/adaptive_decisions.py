"""Why adaptive k chose what it chose: the bench's truncated-draft engine (Qwen3-1.7B-like dummy
target, section adaptive's settings) runs its adaptive cells at the given batches and
temperatures, three times each like the bench, and records for every decode step: wall ms, the
host share, k verified and k proposed, committed tokens, and the controller's predicted step ms
and goodput for every k. Each cell ends with the cost model's and the acceptance model's
snapshot. Prints one line per step of the last repeat and writes $OUT/decisions.json.

    OUT=DIR PYTHONPATH=. python3 scripts/adaptive_decisions.py [--batches 1,16] [--temps 0,1]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specserve.bench import adaptive as ad, shapes
from specserve.bench.engines import ModelCache, random_prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16", help="batch sizes (comma-separated)")
    p.add_argument("--temps", default="0,1", help="temperatures (comma-separated)")
    p.add_argument("--repeats", type=int, default=3, help="adaptive runs per cell")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    s = ad.AdaptiveSettings(batch_sizes=tuple(int(b) for b in a.batches.split(",")),
                            temperatures=tuple(float(t) for t in a.temps.split(",")),
                            ks=tuple(range(1, 9)), prompt_len=32, output_len=32, cell_tokens=128,
                            mid_layers=4, late_scale=0.05, ramp_requests=256, ramp_output_len=128,
                            ramp_rate=2.0)
    tshape, dshape = (shapes.TINY_TARGET, shapes.TINY_DRAFT) if a.tiny else \
        (ad.TARGETS["1.7b"], shapes.QWEN3_06B_LIKE)
    dirs = ad.model_dirs(Path("/tmp/decisions"), tshape, dshape, s.mid_layers)
    cache = ModelCache("cpu" if a.tiny else "cuda", "float32" if a.tiny else "bfloat16", "auto",
                       1024, False, 0)
    target = cache.model(dirs["target"], "dummy", 0)
    ad.soften_late_layers(target, s.mid_layers, s.late_scale)
    ad.copy_prefix(target, cache.model(dirs["mid"], "dummy", 2))
    core = ad.build_core(cache, dirs["target"], dirs["mid"], s)
    ctl = core.spec_control.controller
    print("calibration", json.dumps(ctl.cost.cal.as_dict()), flush=True)
    vocab = core.info.vocab_size
    res: dict = {"calibration": ctl.cost.cal.as_dict(), "cells": {}}
    for t in s.temperatures:
        ad.generate(core, random_prompts(4, s.prompt_len, vocab, 999), t, 8, f"warm-{t}")
        for b in s.batch_sizes:
            prompts = random_prompts(b, s.prompt_len, vocab, 1000 * b)
            for rep in range(a.repeats):
                steps: list = []

                def on_step(st, batch=b) -> None:
                    last = ctl.last
                    steps.append({
                        "ms": round(st.step_seconds * 1e3, 3),
                        "host_ms": None if st.host_wait_seconds is None else
                        round((st.step_seconds - st.host_wait_seconds) * 1e3, 3),
                        "drafts": st.spec_decode.num_draft_tokens,
                        "k_next": max(st.spec_chosen_k, default=0),
                        "tokens": st.num_generation_tokens,
                        "pred_ms": [round(ctl.cost.step_seconds(batch, k) * 1e3, 3)
                                    for k in range(ctl.k_max + 1)],
                        "goodput": [round(g) for g in last.goodput] if last and last.goodput else None})

                run = ad.run_generation(core, prompts, s.output_len_for(b), f"d-{t}-{b}-{rep}",
                                        temperature=t, on_decode_step=on_step)
                key = f"T{t:g}-B{b}-r{rep}"
                res["cells"][key] = {"tok_per_s": run.decode_tok_per_s, "steps": steps,
                                     "cost": ctl.cost.snapshot(),
                                     "acceptance": ctl.acceptance.snapshot()}
                print(f"{key}: {run.decode_tok_per_s:,.1f} tok/s, {len(steps)} decode steps, "
                      f"acceptance {run.spec.acceptance_length}", flush=True)
            for st in steps:
                print("  ", st["ms"], st["host_ms"], st["drafts"], st["k_next"], st["tokens"],
                      st["pred_ms"], st["goodput"], flush=True)
            snap = res["cells"][key]
            print("  cost", json.dumps({k: v for k, v in snap["cost"].items() if k != "calibration"}))
            print("  acceptance", json.dumps(snap["acceptance"]), flush=True)
    (out / "decisions.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
