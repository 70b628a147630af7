"""Median decode step (ms) of the demo target alone (k = 0) or with the demo draft at fixed k, batch 1,
128 greedy tokens after a 16-token warm-up; with a second argument, a cProfile of one more run.

    cd /tmp && PYTHONPATH=REPO python REPO/docs/bench-cpu/2026-12-07-evening/step_time.py K [profile]
"""
import cProfile, pstats, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import adaptive_cpu as ac
from specserve.engine.core import EngineCore
from specserve.engine.llm import make_config
from specserve.bench.engines import run_generation
k = int(sys.argv[1])
common = dict(device="cpu", dtype="float32", max_num_seqs=1, seed=0)
extra = dict(draft_model="demo", num_speculative_tokens=k, speculative_k="fixed") if k else {}
core = EngineCore(make_config("demo", **common, **extra))
run_generation(core, ac.prompts(core.tokenizer, 1), 16, "w")
steps = []
def cb(s): steps.append(time.perf_counter())
g = run_generation(core, ac.prompts(core.tokenizer, 1), 128, "a", on_decode_step=cb)
import statistics
d = [b - a for a, b in zip(steps, steps[1:])]
print("k", k, "tok/s", round(g.decode_tok_per_s, 1), "median step ms", round(1e3 * statistics.median(d), 2), "steps", len(d))
if len(sys.argv) > 2:
    pr = cProfile.Profile(); pr.enable()
    run_generation(core, ac.prompts(core.tokenizer, 1), 128, "b")
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
