"""Sections 1-2: batch-1 decode vs the roofline; verification and draft step costs."""

from __future__ import annotations

from pathlib import Path

from specserve.bench.roofline import measure_decode, roofline_numbers
from specserve.bench.verify import draft_cost, draft_program_cost, verify_costs
from specserve.bench.context import BenchContext
from specserve.bench.report import Column, Section, at_least, at_most

ROOFLINE_GOAL = 0.85
VERIFY_GOAL = 1.10
DRAFT_GOAL = 1.5

_VALUE_COLUMNS = [Column("label", "Quantity", "str"), Column("value", "Value", "row"),
                  Column("goal", "Goal", "str"), Column("status", "Status", "str")]


def roofline(ctx: BenchContext) -> Section:
    o = ctx.opts
    bw = ctx.bandwidth()
    core = ctx.dummy_core("plain")
    name = Path(ctx.dummy_dirs()[0]).name
    ctx.log(f"roofline: timing {o.decode_steps} batch-1 decode steps of {name}")
    dec = measure_decode(core, o.prompt_len, o.decode_warmup, o.decode_steps, o.seed)
    n = roofline_numbers(bw.bytes_per_s, core, dec)
    ctx.shared["decode_step_s"] = dec.median_step_s
    ctx.shared["bandwidth"] = bw.bytes_per_s
    frac = n["fraction_of_roofline"]
    ctx.log(f"roofline: {dec.tok_per_s:.1f} tok/s measured, {n['roofline_tok_per_s']:.1f} roofline "
            f"({100 * frac:.1f}%)")
    rows = [
        {"label": "device copy bandwidth (read + write, median)", "value": bw.bytes_per_s, "kind": "gbps"},
        {"label": f"{name} parameters", "value": n["num_parameters"], "kind": "count"},
        {"label": "parameter bytes", "value": n["parameter_bytes"], "kind": "bytes"},
        {"label": "bytes read per decode step (weights; input embedding: one row)",
         "value": n["bytes_per_decode_step"], "kind": "bytes"},
        {"label": "roofline tokens/s = bandwidth / bytes per step", "value": n["roofline_tok_per_s"],
         "kind": "tps"},
        {"label": f"measured batch-1 decode tokens/s ({ctx.mode['mode'] if ctx.mode else '?'})",
         "value": dec.tok_per_s, "kind": "tps"},
        {"label": "median decode step", "value": dec.median_step_s, "kind": "time"},
        {"label": "fraction of roofline", "value": frac, "kind": "pct",
         "goal": f">= {100 * ROOFLINE_GOAL:.0f}%", "status": at_least(frac, ROOFLINE_GOAL)},
    ]
    return Section("roofline", "Batch-1 decode vs the bandwidth roofline", _VALUE_COLUMNS, rows,
                   notes=[f"Target: {name}, dummy weights, {ctx.dtype}; one greedy request, prompt "
                          f"{o.prompt_len} tokens, {o.decode_warmup} warm-up + {o.decode_steps} timed "
                          "EngineCore steps (prefill excluded).",
                          "Peers on H100 (published): SGLang ~79%, gpt-fast ~63% of roofline at batch 1.",
                          f"Bandwidth: {bw.method}, {bw.buffer_bytes >> 20} MiB buffers, best "
                          f"{bw.best_bytes_per_s / 1e9:.1f} GB/s."],
                   data={"bandwidth": bw.as_dict(), "decode": dec.as_dict(), **n,
                         "execution_mode": ctx.mode})


def verify(ctx: BenchContext) -> Section:
    o = ctx.opts
    bw = ctx.bandwidth()
    core = ctx.dummy_core("pair")
    ctx.log(f"verify: target forwards over k+1 tokens for k in {list(o.verify_ks)}, draft step")
    costs = verify_costs(core, o.verify_ks, o.verify_context, o.warmup, o.repeats)
    draft = draft_cost(core, bw.bytes_per_s, o.verify_context, o.warmup, o.repeats)
    program = draft_program_cost(core, bw.bytes_per_s, o.verify_context, o.warmup, o.repeats)
    ctx.shared["c_batch1"] = draft["c"]
    rows = []
    for r in costs["verify"]:
        goal = r["k"] == o.k
        rows.append({"label": f"verify k={r['k']} ({r['tokens']} tokens) vs 1-token decode",
                     "time": r["seconds"], "reference": costs["decode_seconds"],
                     "ratio": r["ratio_to_decode"], "eager_ratio": r["eager_ratio"],
                     "path": "graph" if r["graph"] else "eager",
                     "goal": f"<= {VERIFY_GOAL:.2f}x" if goal else "",
                     "status": at_most(r["ratio_to_decode"], VERIFY_GOAL) if goal else ""})
    rows.append({"label": "draft step (1 token) vs the draft's roofline", "time": draft["draft_step_seconds"],
                 "reference": draft["roofline_step_seconds"], "ratio": draft["ratio_to_roofline"],
                 "path": "graph" if draft["draft_graph"] else "eager", "goal": f"<= {DRAFT_GOAL:.1f}x",
                 "status": at_most(draft["ratio_to_roofline"], DRAFT_GOAL)})
    rows.append({"label": f"draft program (catch-up + {program['k']} passes + sampling) per draft token "
                          "vs the draft's roofline",
                 "time": program["per_draft_seconds"], "reference": program["roofline_step_seconds"],
                 "ratio": program["ratio_to_roofline"], "path": "graph" if program["graph"] else "eager",
                 "goal": f"<= {DRAFT_GOAL:.1f}x", "status": at_most(program["ratio_to_roofline"], DRAFT_GOAL)})
    rows.append({"label": "c = draft step / target step", "time": draft["draft_step_seconds"],
                 "reference": draft["target_step_seconds"], "ratio": draft["c"],
                 "path": "graph" if draft["draft_graph"] else "eager"})
    cols = [Column("label", "Measurement", "str"), Column("time", "Time", "time"),
            Column("reference", "Reference", "time"), Column("ratio", "Ratio", "x"),
            Column("eager_ratio", "Ratio, both eager", "x"), Column("path", "Path", "str"),
            Column("goal", "Goal", "str"), Column("status", "Status", "str")]
    tgt, dft = (Path(p).name for p in ctx.dummy_dirs())
    return Section("verify", f"Verification and draft step cost at batch 1 (k = {o.k})", cols, rows,
                   notes=[f"{tgt} target, {dft} draft, dummy weights, {ctx.dtype}; runner._forward "
                          f"after {o.verify_context} context tokens, median of {o.repeats} synchronised calls.",
                          "Reference for verify rows: one 1-token target forward; for the draft: its "
                          "weight bytes per step / copy bandwidth.",
                          "Path: how a step runs that forward (CUDA graphs are captured for 1 and k+1 "
                          "tokens only, so other k run eagerly; 'both eager' compares like with like).",
                          "Draft program: what a step runs to propose k drafts for one sampled request "
                          "(draft_loop.py), from host inputs to the host's read of the drafts, divided by k."],
                   data={"target": costs, "draft": draft, "draft_program": program})
