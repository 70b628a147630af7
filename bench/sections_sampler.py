"""Section 3: the rejection sampler, measured by ``bench/rejection_sampler.py`` (its author's
benchmark: called here, not duplicated) and judged against the issue's goals.

It runs as a child process (``python bench/rejection_sampler.py --device ... --out
DIR/rejection_sampler``): on CPU it must set TRITON_INTERPRET=1 before Triton kernels are imported,
which this process cannot do any more, and its device memory is its own. Its JSON and Markdown
stay in DIR beside bench.json. Goals per (B, k): at most half the bytes of vLLM Model Runner V2's
path, >= 70% of copy bandwidth at B >= 64, and under 5% of a decode step (the batch-1 decode step
of the roofline section: the shortest decode step, so the check is conservative).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from specserve.bench.context import BenchContext
from specserve.bench.report import Column, Section, at_least, at_most, is_met

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("rejection_sampler.py")
SCRIPT_MODULE = "specserve.bench.rejection_sampler"
BYTES_GOAL = 0.5          # x vLLM MRv2 bytes
BANDWIDTH_GOAL = 0.70     # of copy bandwidth, at B >= 64
STEP_GOAL = 0.05          # of a decode step
# --quick on CPU: the Triton interpreter is slow; two tiny sizes show the script works
QUICK_ARGS = ["--batch-sizes", "1,2", "--ks", "3", "--vocab", "512", "--dtype", "float32"]

COLUMNS = [Column("batch", "B", "int"), Column("k", "k", "int"),
           Column("call_seconds", "Call time (host incl.)", "time"),
           Column("seconds", "Device time", "time"),
           Column("bytes", "Bytes moved", "bytes"), Column("achieved_bytes_per_s", "Achieved", "bw"),
           Column("frac_copy_bw", "% of copy BW", "pct"), Column("vllm_mrv2_bytes", "vLLM MRv2 bytes", "bytes"),
           Column("bytes_ratio_vs_vllm", "Ours / MRv2", "x"),
           Column("frac_decode_step", "% of decode step", "pct"),
           Column("mean_accepted", "Mean accepted", "num"), Column("goal", "Goal", "str"),
           Column("status", "Status", "str")]


def sampler(ctx: BenchContext) -> Section:
    title = "Rejection sampler: time and bytes moved"
    if not SCRIPT.exists():
        return Section("sampler", title, COLUMNS, skipped="bench/rejection_sampler.py is not in this checkout")
    o = ctx.opts
    stem = ctx.out / "rejection_sampler"
    cmd = [sys.executable, "-m", SCRIPT_MODULE, "--device", ctx.device.type, "--out", str(stem)]
    if ctx.device.type == "cpu" and o.quick:
        cmd += QUICK_ARGS
    elif ctx.dtype != "float32":
        cmd += ["--dtype", ctx.dtype]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(o.cpu_threads)} if o.cpu_threads else {})}
    ctx.log(f"sampler: {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, cwd=str(REPO_ROOT), env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    (ctx.out / "rejection_sampler.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"rejection_sampler.py exited with {proc.returncode}: {proc.stderr[-1500:]}")
    res = json.loads(stem.with_suffix(".json").read_text())
    step = ctx.shared.get("decode_step_s")
    rows = [_row(r, step) for r in res["results"]]
    ctx.log(f"sampler: {len(rows)} sizes, {sum(is_met(r['status']) for r in rows)} meet every goal")
    own_md = stem.with_suffix(".md").read_text() if stem.with_suffix(".md").exists() else ""
    bw = res.get("copy_bandwidth_gbps", 0) * 1e9
    notes = [f"Measured by bench/rejection_sampler.py on {res.get('device')} (its command: "
             f"`{' '.join(['python', *cmd[1:]])}`; raw: rejection_sampler.json, log: rejection_sampler.log).",
             f"% of copy BW is against its own copy-bandwidth measurement ({bw / 1e9:,.0f} GB/s).",
             "Device time: the call replayed as a CUDA graph (the GPU's own time; in a step the "
             "launches overlap the target's forward). Call time: the call as Python makes it, "
             "launch cost included (at small B mostly host time). Achieved bandwidth and % of "
             "decode step use the device time.",
             "vLLM MRv2 bytes: ~6V per draft token + ~6V per request + ~14V per logits row "
             "(its fp32 copy of the logits).",
             "% of decode step: against the batch-1 decode step of section 1"
             + (f" ({1e3 * step:.3g} ms)." if step else " (not measured in this run: n/a).")]
    extra = ("<details><summary>rejection_sampler.py's own table</summary>\n\n"
             + _demote_headings(own_md) + "\n</details>") if own_md else ""
    return Section("sampler", title, COLUMNS, rows, notes=notes, extra_markdown=extra,
                   data={"result": res, "bandwidth_bytes_per_s": bw, "decode_step_s": step,
                         "command": cmd[1:]})


def _row(r: dict, decode_step_s: Optional[float]) -> dict:
    """Bandwidth and the share of a step are judged on the device time where there is one (in
    a step the sampler's launches overlap the target's forward); the call time is shown too."""
    call = r["median_ms"] / 1e3
    seconds = r["device_ms"] / 1e3 if r.get("device_ms") is not None else call
    frac_step = seconds / decode_step_s if decode_step_s else None
    checks = [("bytes", at_most(r["bytes_ratio_vs_vllm"], BYTES_GOAL))]
    goal = [f"<= {BYTES_GOAL}x MRv2 bytes"]
    if r["B"] >= 64:
        checks.append(("bandwidth", at_least(r["frac_copy_bw"], BANDWIDTH_GOAL)))
        goal.append(f">= {100 * BANDWIDTH_GOAL:.0f}% BW")
    checks.append(("step", at_most(frac_step, STEP_GOAL)))
    goal.append(f"< {100 * STEP_GOAL:.0f}% of a step")
    missed = [f"{name}: {status}" for name, status in checks if not is_met(status)]
    return {"label": f"B={r['B']} k={r['k']}", "batch": r["B"], "k": r["k"], "seconds": seconds,
            "call_seconds": call,
            "bytes": r["bytes"], "achieved_bytes_per_s": r["gbps"] * 1e9, "frac_copy_bw": r["frac_copy_bw"],
            "vllm_mrv2_bytes": r["vllm_mrv2_bytes"], "bytes_ratio_vs_vllm": r["bytes_ratio_vs_vllm"],
            "frac_decode_step": frac_step, "mean_accepted": r.get("mean_accepted"),
            "goal": "; ".join(goal), "status": "met" if not missed else "; ".join(missed)}


def _demote_headings(md: str) -> str:
    return "\n".join("#### " + ln.lstrip("# ") if ln.startswith("#") else ln for ln in md.splitlines())
