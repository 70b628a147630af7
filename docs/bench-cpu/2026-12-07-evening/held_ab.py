"""CPU: plain engine vs adaptive engines (random draft) natural and held at zero, batch 1."""
import statistics, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import adaptive_cpu as ac
from specserve.bench.adaptive import variant_controllers
from specserve.engine.core import EngineCore
from specserve.engine.llm import make_config

tmp = Path(tempfile.mkdtemp())
rd = ac.random_draft(tmp / "rd")
common = dict(device="cpu", dtype="float32", max_num_seqs=1, seed=0)
eng = {"plain": EngineCore(make_config("demo", **common)),
       "adaptive": EngineCore(make_config("demo", draft_model=rd, num_speculative_tokens=4, speculative_k="adaptive", **common)),
       "held": EngineCore(make_config("demo", draft_model=rd, num_speculative_tokens=4, speculative_k="adaptive", **common))}
eng["held"].spec_control.controller = variant_controllers(eng["held"], ("held-zero",))["adaptive:held-zero"]
for k, c in eng.items():
    ac.run_once(c, 1, 8, k + "w")
res = {k: [] for k in eng}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
    for k, c in eng.items():
        res[k].append(ac.run_once(c, 1, 128, f"{k}{r}")["tok_per_s"])
for k in eng:
    rat = [a / b for a, b in zip(res[k], res["plain"])]
    print(k, f"median {statistics.median(res[k]):.1f}", f"ratio {statistics.median(rat):.3f}", [round(x) for x in res[k]])
