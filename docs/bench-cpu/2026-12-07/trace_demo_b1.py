"""Trace of the CPU goal that missed on 2026-12-07 (demo draft, batch 1): the plain engine, fixed
k = 4 and adaptive k on the demo pair, alternated over five 128-token repeats as
scripts/adaptive_cpu.py runs them, printing each repeat's proposed k per decode step and the
adaptive cost model's measured step-time cells (batch bucket, k -> ms).

    cd /tmp && python /work/main/docs/bench-cpu/2026-12-07/trace_demo_b1.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import adaptive_cpu as ac  # noqa: E402
from specserve.engine.core import EngineCore  # noqa: E402
from specserve.engine.llm import make_config  # noqa: E402

common = dict(device="cpu", dtype="float32", max_num_seqs=16, seed=0)
eng = {"plain": EngineCore(make_config("demo", **common)),
       "fixed": EngineCore(make_config("demo", draft_model="demo", num_speculative_tokens=4,
                                       speculative_k="fixed", **common)),
       "adaptive": EngineCore(make_config("demo", draft_model="demo", num_speculative_tokens=4,
                                          speculative_k="adaptive", **common))}
ctl = eng["adaptive"].spec_control.controller
steps = []
observe = ctl.observe_step


def observed(batch, k_verify, k_draft, tokens, seconds, *rest):
    steps.append(k_draft)
    return observe(batch, k_verify, k_draft, tokens, seconds, *rest)


ctl.observe_step = observed
for core in eng.values():
    ac.run_once(core, 1, 8, "warm")
tps = {name: [] for name in eng}
for r in range(5):
    for name, core in eng.items():
        steps.clear()
        tps[name].append(ac.run_once(core, 1, 128, f"{name}{r}")["tok_per_s"])
        if name == "adaptive":
            cells = ctl.cost.snapshot()["measured_step_seconds"]
            print(f"repeat {r}: k proposed per step {steps}")
            print(f"  cells (ms): { {k: round(v * 1e3, 1) for k, v in cells.items()} }")
print("tok/s per repeat:", {name: [round(x) for x in v] for name, v in tps.items()})
print("chosen k counts (adaptive, warm-up included):", ctl.chosen_counts)
