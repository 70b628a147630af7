"""Sections 1-2: batch-1 decode vs the roofline and a compiled peer; verification and draft step costs."""

from __future__ import annotations

from pathlib import Path

from specserve.bench.compiled_peer import peer_cache_len, peer_for_model
from specserve.bench.engines import execution_mode, free_device_memory, random_prompts
from specserve.bench.roofline import measure_decode, roofline_numbers
from specserve.bench.verify import draft_cost, draft_program_cost, verify_costs
from specserve.bench.context import BenchContext
from specserve.bench.report import Column, Section, at_least, at_most

ROOFLINE_GOAL = 0.85
PEER_GOAL = 1.05          # ours / the compiled peer, batch-1 decode
VERIFY_GOAL = 1.10
DRAFT_GOAL = 1.5


def roofline(ctx: BenchContext) -> Section:
    """Ours and the compiled peer at each roofline shape, one row group per shape."""
    o = ctx.opts
    bw = ctx.bandwidth()
    first, *others = ctx.roofline_shapes()
    results: dict[str, dict] = {}
    # the other shapes first, each freed before the next: the dummy target's engine, measured
    # last, stays loaded for the sections after this one
    for shape in others:
        try:
            core, cache, path = ctx.extra_plain_core(shape)
        except Exception as e:   # noqa: BLE001 - one shape's failure must not lose the others
            results[shape.name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        try:
            results[shape.name] = _ours_and_peer(ctx, core, path, bw.bytes_per_s)
        except Exception as e:   # noqa: BLE001
            results[shape.name] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            del core
            cache.release()
    main = _ours_and_peer(ctx, ctx.dummy_core("plain"), ctx.dummy_dirs()[0], bw.bytes_per_s)
    ctx.shared["decode_step_s"] = main["median_step_s"]
    ctx.shared["bandwidth"] = bw.bytes_per_s
    results = {first.name: main, **results}
    rows = [{"model": "(device)", "label": "copy bandwidth (read + write, median)", "value": bw.bytes_per_s,
             "kind": "gbps"}]
    for name, r in results.items():
        rows += _shape_rows(name, r)
    failed = [f"{n}: {r['error']}" for n, r in results.items() if "error" in r] + \
             [f"{n} peer: {r['peer']['error']}" for n, r in results.items() if "error" in r.get("peer", {})]
    peer_notes = [f"{n}: {_peer_note(r['peer'])}" for n, r in results.items() if "peer" in r]
    cols = [Column("model", "Model", "str"), Column("label", "Quantity", "str"),
            Column("value", "Value", "row"), Column("goal", "Goal", "str"), Column("status", "Status", "str")]
    peer_steps = max(o.decode_warmup, PEER_MIN_WARMUP)
    return Section("roofline", "Batch-1 decode vs the bandwidth roofline, and a compiled peer", cols, rows,
                   notes=[f"Targets: {', '.join(results)}; dummy weights, {ctx.dtype}; one greedy request, "
                          f"prompt {o.prompt_len} tokens, prefill excluded. Ours: {o.decode_warmup} warm-up + "
                          f"{o.decode_steps} timed EngineCore steps, with decode-ahead (the default); the "
                          "same engine with --no-async-scheduling is timed just before.",
                          "Peer: bench/compiled_peer.py, a plain-PyTorch Llama-family decoder in gpt-fast's "
                          "manner (static KV cache indexed by input_pos, SDPA, greedy argmax, "
                          "torch.compile(decode_one_token, fullgraph=True), mode reduce-overhead on CUDA, "
                          "default on CPU) over the same weight tensors as ours (shared, so the same bytes "
                          f"per step); {peer_steps} warm-up + {o.decode_steps} timed steps, each ending "
                          "with the host reading the token; run right after ours, same prompt.",
                          "Peer compile: " + "; ".join(peer_notes) if peer_notes else "Peer: not run.",
                          f"Order: {', '.join(s.name for s in others)} first (freed afterwards), then "
                          f"{first.name}, whose engine the later sections reuse.",
                          "Peers on H100 (published): SGLang ~79%, gpt-fast ~63% of roofline at batch 1.",
                          f"Bandwidth: {bw.method}, {bw.buffer_bytes >> 20} MiB buffers, best "
                          f"{bw.best_bytes_per_s / 1e9:.1f} GB/s."],
                   error="; ".join(failed) or None,
                   data={"bandwidth": bw.as_dict(), **main, "execution_mode": ctx.mode, "shapes": results})


PEER_MIN_WARMUP = 3      # compile, record the CUDA graph, replay it once


def _ours_and_peer(ctx: BenchContext, core, checkpoint: str, bandwidth: float) -> dict:
    """Our batch-1 decode on ``core``, then the compiled peer over the same weights."""
    o = ctx.opts
    name = Path(checkpoint).name
    sync = None
    if core.decode_ahead is not None:   # the same engine as --no-async-scheduling builds it, first
        ahead, core.decode_ahead = core.decode_ahead, None
        ctx.log(f"roofline: timing {o.decode_steps} batch-1 decode steps of {name} (ours, synchronous)")
        try:
            sync = measure_decode(core, o.prompt_len, o.decode_warmup, o.decode_steps, o.seed)
        finally:
            core.decode_ahead = ahead
    ctx.log(f"roofline: timing {o.decode_steps} batch-1 decode steps of {name} (ours)")
    dec = measure_decode(core, o.prompt_len, o.decode_warmup, o.decode_steps, o.seed)
    n = roofline_numbers(bandwidth, core, dec)
    ctx.log(f"roofline: {name} ours {dec.tok_per_s:.1f} tok/s, roofline {n['roofline_tok_per_s']:.1f} "
            f"({100 * n['fraction_of_roofline']:.1f}%)"
            + (f"; synchronous {sync.tok_per_s:.1f} tok/s" if sync else ""))
    out = {**n, "decode": dec.as_dict(), "execution_mode": execution_mode(core),
           "decode_ahead": core.decode_ahead is not None}
    if sync is not None:
        out["synchronous"] = {"decode": sync.as_dict(), "tok_per_s": sync.tok_per_s,
                              "median_step_s": sync.median_step_s}
    out["peer"] = _peer(ctx, core, checkpoint, n["roofline_tok_per_s"], dec.tok_per_s)
    return out


def _peer(ctx: BenchContext, core, checkpoint: str, roofline_tps: float, ours_tps: float) -> dict:
    o = ctx.opts
    name = Path(checkpoint).name
    warmup = max(o.decode_warmup, PEER_MIN_WARMUP)
    prompt = random_prompts(1, o.prompt_len, core.info.vocab_size, o.seed)[0]   # ours' prompt
    ctx.log(f"roofline: {name} compiled peer: compiling, {warmup} warm-up + {o.decode_steps} timed steps")
    peer = None
    try:
        peer = peer_for_model(core.runner.target, checkpoint,
                              peer_cache_len(o.prompt_len, warmup + o.decode_steps + 1))
        m = peer.measure(prompt, warmup, o.decode_steps)
    except Exception as e:   # noqa: BLE001 - ours stands without the peer
        ctx.log(f"roofline: {name} compiled peer FAILED: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        if peer is not None:
            peer.close()
        free_device_memory(ctx.device)
    ctx.log(f"roofline: {name} peer {m.tok_per_s:.1f} tok/s ({m.compile_mode}; first call "
            f"{m.first_call_s:.1f}s)")
    return {**m.as_dict(), "fraction_of_roofline": m.tok_per_s / roofline_tps,
            "ours_over_peer": ours_tps / m.tok_per_s}


def _peer_note(p: dict) -> str:
    if "error" in p:
        return f"failed ({p['error']})"
    skips = p.get("cudagraph_skips")
    mode = p["compile_mode"] + (f" ({p['compile_note']})" if p["compile_note"] else "")
    return (f"{mode}, first decode call (compiling) {p['first_call_s']:.1f}s"
            + (f", Inductor skipped CUDA graphs {skips} times" if skips else ""))


def _shape_rows(name: str, r: dict) -> list[dict]:
    """One row group: the shape's roofline, ours, the peer, and ours / peer."""
    if "error" in r:
        return [{"model": name, "label": "ours and peer", "value": None, "status": f"failed: {r['error']}"}]
    frac = r["fraction_of_roofline"]
    rows = [
        {"label": "parameters", "value": r["num_parameters"], "kind": "count"},
        {"label": "bytes read per decode step (weights; input embedding: one row)",
         "value": r["bytes_per_decode_step"], "kind": "bytes"},
        {"label": "roofline tokens/s = bandwidth / bytes per step", "value": r["roofline_tok_per_s"],
         "kind": "tps"},
        {"label": f"ours: batch-1 decode tokens/s ({r['execution_mode']['mode']})",
         "value": r["measured_tok_per_s"], "kind": "tps"},
        {"label": "ours: median decode step", "value": r["median_step_s"], "kind": "time"},
        {"label": f"ours: fraction of roofline ({name})", "value": frac, "kind": "pct",
         "goal": f">= {100 * ROOFLINE_GOAL:.0f}%", "status": at_least(frac, ROOFLINE_GOAL)},
    ]
    if "synchronous" in r:   # the same engine without decode-ahead, timed just before
        sync = r["synchronous"]
        rows += [
            {"label": "ours, --no-async-scheduling: tokens/s", "value": sync["tok_per_s"], "kind": "tps"},
            {"label": "ours, --no-async-scheduling: median decode step", "value": sync["median_step_s"],
             "kind": "time"},
            {"label": "decode-ahead: ours / ours with --no-async-scheduling",
             "value": r["measured_tok_per_s"] / sync["tok_per_s"], "kind": "x"},
        ]
    p = r["peer"]
    if "error" in p:
        rows.append({"label": f"ours / peer ({name})", "value": None, "goal": f">= {PEER_GOAL:.2f}x",
                     "status": f"failed: the peer: {p['error']}"})
    else:
        ratio = p["ours_over_peer"]
        eager_on_gpu = p["compile_mode"] == "eager" and r["execution_mode"]["mode"] != "eager"
        rows += [
            {"label": f"peer: compiled PyTorch decode tokens/s ({p['compile_mode']})", "value": p["tok_per_s"],
             "kind": "tps"},
            {"label": "peer: median decode step", "value": p["median_step_s"], "kind": "time"},
            {"label": "peer: fraction of roofline", "value": p["fraction_of_roofline"], "kind": "pct"},
            {"label": f"ours / peer ({name})", "value": ratio, "kind": "x", "goal": f">= {PEER_GOAL:.2f}x",
             "status": "n/a (the peer ran eagerly)" if eager_on_gpu else at_least(ratio, PEER_GOAL)},
        ]
    return [{"model": name, **row} for row in rows]


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
