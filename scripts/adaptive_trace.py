"""Per-step trace of adaptive k on the GPU: the bench's adaptive engines (Qwen3-1.7B-like dummy
target; the unrelated 0.6B-like draft, the truncated draft, and no draft) each run batch 1, 64
and 1 again after a short warm-up. For every step: wall ms, the batch's k, prompt tokens,
draft tokens verified, target and draft ms, and the controller's goodput for k = 0..4. Prints
each cell's slowest steps and writes $OUT/diag.json.

    OUT=DIR PYTHONPATH=. python3 scripts/adaptive_trace.py
"""
import json, os, time
from pathlib import Path
import torch
from specserve.bench import adaptive as ad, shapes
from specserve.bench.engines import ModelCache, random_prompts
out = Path(os.environ["OUT"])
s = ad.AdaptiveSettings(batch_sizes=(1, 64), temperatures=(0.0,), ks=tuple(range(1, 9)), prompt_len=32,
                        output_len=32, cell_tokens=128, mid_layers=4, late_scale=0.05, ramp_requests=64,
                        ramp_output_len=32, ramp_rate=2.0)
dirs = ad.model_dirs(Path("/tmp/diag"), ad.TARGETS["1.7b"], shapes.QWEN3_06B_LIKE, 4)
cache = ModelCache("cuda", "bfloat16", "auto", 1024, False, 0)
target = cache.model(dirs["target"], "dummy", 0)
ad.soften_late_layers(target, 4, 0.05)
mid = cache.model(dirs["mid"], "dummy", 2); ad.copy_prefix(target, mid)
cache.model(dirs["unrelated"], "dummy", 1)
res = {}
for pair in ("unrelated", "mid", None):
    core = ad.build_core(cache, dirs["target"], dirs[pair] if pair else None, s)
    ctl = core.spec_control.controller if core.spec_control else None
    if ctl is not None and ctl.cost is not None:
        print(f"{pair}: calibration {ctl.cost.cal.seconds:.1f}s", flush=True)
    vocab = core.info.vocab_size
    ad.generate(core, random_prompts(4, 32, vocab, 999), 0.0, 8, "warm")
    for b in (1, 64, 1):
        prompts = random_prompts(b, 32, vocab, 1000 * b)
        params = ad._params(0.0, max(32, 128 // b))
        for i, p in enumerate(prompts):
            core.add_request(f"{pair}-{b}-{i}-{time.time()}", p, params)
        trace = []
        while core.has_unfinished():
            t0 = time.perf_counter()
            outs, st = core.step()
            dt = time.perf_counter() - t0
            trace.append([round(dt * 1e3, 2), max(st.spec_chosen_k, default=0), st.num_prompt_tokens,
                          st.spec_decode.num_draft_tokens, round(st.target_seconds * 1e3, 2), round(st.draft_seconds * 1e3, 2),
                          [round(g) for g in (ctl.last.goodput if ctl and ctl.last else [])][:5]])
        key = f"{pair}-B{b}-{len(res)}"
        res[key] = {"steps": len(trace), "total_ms": round(sum(t[0] for t in trace), 1), "trace": trace,
                    "cost": ctl.cost.snapshot() if ctl and ctl.cost else None}
        print(key, res[key]["steps"], res[key]["total_ms"], "ms", flush=True)
        print("  slowest:", sorted(trace, key=lambda t: -t[0])[:6], flush=True)
    ad.drop(core, torch.device("cuda"))
(out / "diag.json").write_text(json.dumps(res))
