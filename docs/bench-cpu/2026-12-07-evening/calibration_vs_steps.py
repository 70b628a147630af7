"""The demo pair's eager calibration beside the steps it prices: the calibrated table, its predicted step
times at batch 1, then measured step cells after runs forced to k = 0 / 1 / 2, and the learnt scales."""
import json
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import adaptive_cpu as ac
from specserve.engine.core import EngineCore
from specserve.engine.llm import make_config
from specserve.bench.engines import run_generation
common = dict(device="cpu", dtype="float32", max_num_seqs=16, seed=0)
core = EngineCore(make_config("demo", draft_model="demo", num_speculative_tokens=4, speculative_k="adaptive", **common))
cost = core.spec_control.controller.cost
print(json.dumps(cost.cal.as_dict()))
print("pred b1", [round(1e3 * cost.step_seconds(1, k), 2) for k in range(5)])
ctl = core.spec_control.controller
ctl.force = lambda r: FORCE
for FORCE in (0, 1, 2, 0, 1, 2):
    run_generation(core, ac.prompts(core.tokenizer, 1), 40, f"f{FORCE}")
print(json.dumps(cost.snapshot()["measured_step_seconds"]))
print("residuals plain", {b: round(1e3*e.value,2) for b, e in cost.overhead.items()}, "drafting", {b: round(1e3*e.value,2) for b, e in cost.drafting_overhead.items()}, "zero scale", cost.zero_scale.value)
print("drafting scale by batch bucket", cost.snapshot()["drafting_step_over_calibration"])
print("pred b1 after", [round(1e3 * cost.step_seconds(1, k), 2) for k in range(5)], "b16", [round(1e3 * cost.step_seconds(16, k), 2) for k in range(5)])
