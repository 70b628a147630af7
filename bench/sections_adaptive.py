"""Section 7: adaptive k against no speculation and every fixed k (issue 14), plus a load ramp.

The measuring is in bench/adaptive.py; this file builds the models and engines in an order that
keeps device memory low (one engine at a time), turns the grid into rows with the issue's goals,
and draws the plots.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Optional

from specserve.bench import adaptive as ad
from specserve.bench import shapes
from specserve.bench.context import BenchContext
from specserve.bench.engines import ModelCache, free_device_memory
from specserve.bench.report import MET, Column, Section, at_least, is_met

GOAL_PLAIN, GOAL_FIXED, GOAL_RAMP = 0.97, 0.95, 1.0
PAIRS = (("unrelated", "unrelated dummy draft"), ("self", "self-draft"), ("mid", "truncated draft"))
RAMP_PAIR = "mid"
RAMP_TEMPERATURE = 0.0


def settings(ctx: BenchContext) -> ad.AdaptiveSettings:
    o = ctx.opts
    return ad.AdaptiveSettings(
        batch_sizes=tuple(o.adaptive_batch_sizes), temperatures=(0.0, 1.0), ks=tuple(o.adaptive_ks),
        prompt_len=o.adaptive_prompt_len, output_len=o.adaptive_output_len,
        cell_tokens=o.adaptive_cell_tokens, mid_layers=o.adaptive_mid_layers,
        late_scale=o.adaptive_late_scale, ramp_requests=o.adaptive_ramp_requests,
        ramp_output_len=o.adaptive_ramp_output_len, ramp_rate=o.adaptive_ramp_rate, seed=o.seed,
        cell_warmup_tokens=o.adaptive_cell_warmup_tokens)


def _shapes(ctx: BenchContext) -> tuple[shapes.ModelShape, shapes.ModelShape]:
    if ctx.opts.quick:
        return shapes.TINY_TARGET, shapes.TINY_DRAFT
    return ad.TARGETS[ctx.opts.adaptive_target], shapes.QWEN3_06B_LIKE


def adaptive(ctx: BenchContext) -> Section:
    o, s = ctx.opts, settings(ctx)
    ctx.release_models()                 # this section loads its own target
    tshape, dshape = _shapes(ctx)
    dirs = ad.model_dirs(ctx.tmp / "adaptive", tshape, dshape, s.mid_layers)
    cache = ModelCache(str(ctx.device), ctx.dtype, o.kernel_backend, o.max_model_len,
                       o.enforce_eager, o.seed, o.ragged_graph_tokens)
    pm = ad.load_pair_models(cache, dirs, s, o.seed)
    tbytes = ad.param_bytes(pm.target)
    models = {"target": tshape.name, "target_bytes": tbytes, "softened_layers": pm.softened_layers,
              "mid_layers": s.mid_layers, "late_scale": s.late_scale,
              "bytes_ratio": {"unrelated": ad.param_bytes(pm.unrelated) / tbytes, "self": 1.0,
                              "mid": ad.param_bytes(pm.mid) / tbytes}}
    ctx.log(f"adaptive: {tshape.name} target (layers {s.mid_layers}.. scaled by {s.late_scale}), "
            f"drafts: {dshape.name}, self, first {s.mid_layers} layers; load "
            + ", ".join(f"{Path(p).name} {t:.1f}s" for p, t in cache.load_seconds.items()))
    data: dict = {"settings": s.__dict__, "models": models, "grid": {}, "ramp": {}, "errors": {},
                  "exact_width_graphs": {}}
    fixed = [f"k{k}" for k in s.ks]

    # the plain engine stays up beside each pair's engine: every cell runs both side by side
    plain_core = ad.build_core(cache, dirs["target"], None, s)
    ctx.log("adaptive: plain engine ready")
    core = None
    for pair, label in PAIRS:
        if pair not in o.adaptive_pairs:
            continue
        draft_dir = dirs["target"] if pair == "self" else dirs[pair]
        try:
            core = ad.build_core(cache, dirs["target"], draft_dir, s)
            cal = core.spec_control.controller.cost.cal if core.spec_control.controller.cost else None
            ctx.log(f"adaptive: {label} engine ready (calibration "
                    f"{'n/a' if cal is None else f'{cal.seconds:.1f}s'})")
            extra = ad.capture_exact_widths(core, s.ks, ctx.log) if o.adaptive_exact_widths else {}
            data["exact_width_graphs"][pair] = sorted(q for _, q in extra)
            variants = ad.variant_controllers(core, o.adaptive_variants)
            configs = ["plain"] + fixed + ["adaptive"] + list(variants)
            data["grid"][pair] = ad.measure_grid(core, s, pair, configs, extra, ctx.log, plain_core,
                                                 o.adaptive_repeats, variants)
            if pair == RAMP_PAIR:   # no speculation and adaptive side by side, as in the cells
                data["ramp"] = ad.measure_ramp(core, s, ["plain"] + fixed + ["adaptive"] + list(variants),
                                               extra, RAMP_TEMPERATURE, pair, ctx.log, variants,
                                               plain_core, o.adaptive_repeats)
            data.setdefault("calibration", {})[pair] = None if cal is None else cal.as_dict()
            del extra
        except Exception as e:   # noqa: BLE001 - one pair failing must not lose the others
            ctx.log(f"adaptive: {label} FAILED: {type(e).__name__}: {e}")
            data["errors"][pair] = f"{type(e).__name__}: {e}"
        finally:
            core = None                      # the last reference: then it can be collected
            free_device_memory(ctx.device)
    plain_core = None
    cache.release()
    rows = _rows(data, s)
    data["acceptance"] = _acceptance(data, s)
    plots = _plots(ctx, data, s) if o.plots else []
    data["plots"] = plots
    return Section("adaptive", f"Adaptive k vs no speculation and fixed k = {min(s.ks)}..{s.k_max}",
                   _columns(s, o.adaptive_variants), rows, notes=_notes(ctx, data, s, tshape, dshape),
                   data=data, extra_markdown="\n\n".join(f"![{Path(p).stem}]({p})" for p in plots),
                   error="; ".join(f"{k}: {v}" for k, v in data["errors"].items()) or None)


# ---- rows ----------------------------------------------------------------------------------------
def _columns(s: ad.AdaptiveSettings, variants: tuple[str, ...] = ()) -> list[Column]:
    """The grid's columns; each controller variant (A/B) adds its tok/s, its median paired
    ratio to no speculation and its mean k after adaptive's."""
    extra = []
    for v in variants:
        extra += [Column(f"adaptive:{v}", v, "tps"), Column(f"adaptive:{v}_over_plain", f"{v}/no-spec", "x"),
                  Column(f"adaptive:{v}_mean_k", f"mean k ({v})", "num")]
    return ([Column("pair", "Pair", "str"), Column("temperature", "T", "num"),
             Column("batch", "Batch", "str"), Column("plain", "no spec", "tps")]
            + [Column(f"k{k}", f"k={k}", "tps") for k in s.ks]
            + [Column("adaptive", "adaptive", "tps"), Column("best_fixed_k", "best k", "int"),
               Column("adaptive_over_plain", "ad/no-spec", "x"),
               Column("adaptive_over_best_fixed", "ad/best k", "x"),
               Column("mean_k", "mean k (ad)", "num"), Column("accept_len", "E (ad)", "num")]
            + extra + [Column("goal", "Goal", "str"), Column("status", "Status", "str")])


def _compare(plain: Optional[float], fixed: dict[str, Optional[float]], ada: Optional[float]) -> dict:
    known = {c: v for c, v in fixed.items() if v}
    best = max(known, key=known.get) if known else None
    return {"plain": plain, **fixed, "adaptive": ada,
            "best_fixed_k": int(best[1:]) if best else None,
            "best_fixed_tok_per_s": known.get(best) if best else None,
            "adaptive_over_plain": ada / plain if ada and plain else None,
            "adaptive_over_best_fixed": ada / known[best] if ada and best else None}


def _rows(data: dict, s: ad.AdaptiveSettings) -> list[dict]:
    rows = []
    goal = f">= {GOAL_PLAIN:.2f}x no-spec, >= {GOAL_FIXED:.2f}x best fixed k"
    for pair, label in PAIRS:
        grid = data["grid"].get(pair)
        if grid is None:
            continue
        for t in s.temperatures:
            for b in s.batch_sizes:
                cell = {c: grid[c][t][b] for c in grid}
                row = _compare(cell["plain"]["tok_per_s"],
                               {f"k{k}": cell[f"k{k}"]["tok_per_s"] for k in s.ks},
                               cell["adaptive"]["tok_per_s"])
                paired = [r for r in cell["adaptive"].get("over_plain_runs", []) if r]
                if len(paired) > 1:   # side-by-side runs: the median of their ratios
                    row["adaptive_over_plain"] = statistics.median(paired)
                _pair_with_best(row, cell)
                row.update(pair=label, temperature=t, batch=str(b), label=f"{label}, T={t:g}, batch {b}",
                           mean_k=ad.mean_k(cell["adaptive"]["chosen_k"]),
                           accept_len=cell["adaptive"]["acceptance_length"], goal=goal)
                _variant_columns(row, cell)
                row["status_plain"] = at_least(row["adaptive_over_plain"], GOAL_PLAIN)
                row["status_fixed"] = at_least(row["adaptive_over_best_fixed"], GOAL_FIXED)
                row["status"] = _both(row["status_plain"], row["status_fixed"])
                rows.append(row)
    ramp = data["ramp"]
    if "adaptive" in ramp and "plain" in ramp:
        row = _compare(ramp["plain"]["tok_per_s"], {f"k{k}": ramp[f"k{k}"]["tok_per_s"] for k in s.ks},
                       ramp["adaptive"]["tok_per_s"])
        paired = [r for r in ramp["adaptive"].get("over_plain_runs", []) if r]
        if len(paired) > 1:
            row["adaptive_over_plain"] = statistics.median(paired)
        _pair_with_best(row, ramp)
        peak = ramp["adaptive"]["peak_batch"]
        label = dict(PAIRS)[RAMP_PAIR]
        _variant_columns(row, ramp)
        row.update(pair=f"{label}, ramp", temperature=RAMP_TEMPERATURE, batch=f"1-{peak}-1",
                   label=f"{label}, ramp 1 -> {peak} -> 1", mean_k=ad.mean_k(ramp["adaptive"]["chosen_k"]),
                   accept_len=ramp["adaptive"]["acceptance_length"],
                   goal=f">= {GOAL_RAMP:.2f}x best fixed k")
        row["status"] = at_least(row["adaptive_over_best_fixed"], GOAL_RAMP)
        rows.append(row)
    return rows


def _pair_with_best(row: dict, results: dict) -> None:
    """ad/best k as the median, over rounds, of each adaptive run over the best fixed k's run of
    the same round (the best k: the best median; ``runs`` hold each config's tok/s in round
    order, one a round), when at least two rounds have both: like ad/no-spec, a ratio of runs
    seconds apart drifts less than one of medians over the cell."""
    best = row.get("best_fixed_k")
    if best is None:
        return
    ada, fixed = results["adaptive"].get("runs", []), results[f"k{best}"].get("runs", [])
    ratios = [a / f for a, f in zip(ada, fixed) if a and f]
    if len(ratios) > 1:
        row["adaptive_over_best_fixed"] = statistics.median(ratios)


def _variant_columns(row: dict, results: dict) -> None:
    """Each controller variant's tok/s, its ratio to no speculation (the median of its paired
    runs, else its shown run's) and its mean k, from a cell's or the ramp's ``results``."""
    for c, r in results.items():
        if c.startswith("adaptive:"):
            runs = [x for x in r.get("over_plain_runs", []) if x]
            tps = row[c] = r["tok_per_s"]
            row[f"{c}_over_plain"] = (statistics.median(runs) if runs else
                                      tps / row["plain"] if tps and row["plain"] else None)
            row[f"{c}_mean_k"] = ad.mean_k(r["chosen_k"])


def _both(plain: str, fixed: str) -> str:
    if is_met(plain) and is_met(fixed):
        return MET
    if plain == "n/a" and fixed == "n/a":
        return "n/a"
    return "; ".join(f"{name} {st}" for name, st in (("no-spec:", plain), ("best k:", fixed))
                     if not is_met(st))


def _acceptance(data: dict, s: ad.AdaptiveSettings) -> dict:
    """Per pair and temperature: conditional acceptance per position at fixed k_max, batch 1
    (and the mean acceptance length of every fixed-k cell)."""
    from specserve.engine.types import SpecDecodeStats

    out: dict = {}
    for pair, grid in data["grid"].items():
        for t in s.temperatures:
            row = grid[f"k{s.k_max}"][t][min(s.batch_sizes)]
            sd = row["spec_decode"]
            stats = SpecDecodeStats(sd["num_drafts"], sd["num_draft_tokens"], sd["num_accepted_tokens"],
                                    list(sd["accepted_per_position"]))
            out.setdefault(pair, {})[str(t)] = {
                "per_position": [round(a, 4) for a in ad.conditional_rates(stats)],
                "acceptance_length": stats.acceptance_length}
    return out


def _notes(ctx: BenchContext, data: dict, s: ad.AdaptiveSettings, tshape, dshape) -> list[str]:
    m = data["models"]
    acc = data["acceptance"]
    def rates(pair: str) -> str:
        parts = []
        for t, a in acc.get(pair, {}).items():
            pos = a["per_position"]
            mean = sum(x for x in pos if not math.isnan(x)) / max(1, len(pos))
            parts.append(f"T={float(t):g}: " + " ".join(f"{x:.2f}" for x in pos) + f" (mean {mean:.2f})")
        return "; ".join(parts) or "n/a"

    return [
        f"Target: dummy {tshape.name} ({m['target_bytes'] / 1e9:.2f} GB); its layers {s.mid_layers}.."
        f"{tshape.num_layers - 1} have o_proj and down_proj scaled by {s.late_scale} (a random model "
        "whose later layers refine, so that a prefix of it can predict it). Pairs: an unrelated "
        f"dummy {dshape.name} draft (bytes {m['bytes_ratio']['unrelated']:.2f}x the target's), the "
        f"target as its own draft (1.00x), and a truncated draft = the target's first {s.mid_layers} "
        "layers + embedding + final norm + LM head, weights copied from the target "
        f"({m['bytes_ratio']['mid']:.2f}x).",
        "Conditional acceptance per draft position (fixed k = "
        f"{s.k_max}, batch {min(s.batch_sizes)}): truncated draft {rates('mid')}; unrelated "
        f"{rates('unrelated')}; self {rates('self')}.",
        f"Tokens/s of the decode phase (from the step in which every request had its first token); "
        f"prompts of {s.prompt_len} random ids, max(output_len {s.output_len}, {s.cell_tokens} / batch) "
        "tokens per request, ignore_eos, unseeded (seeded sampled requests are pinned to k = 0). "
        f"A warm-up per configuration and temperature, then in each cell "
        + (f"an untimed run of each configuration over the cell's prompts ({s.cell_warmup_tokens} "
           "tokens each; adaptive learns from it too) and " if s.cell_warmup_tokens > 0 else "")
        + f"{ctx.opts.adaptive_repeats} rounds of: no speculation and adaptive side by side, then "
        "every fixed k. Each configuration shows its median run (the best fixed k: the best "
        "median); ad/no-spec is the median of the paired ratios (each adaptive run over the "
        "no-spec run just before it) and ad/best k the median of each adaptive run over the best "
        "k's run of the same round, since the host's speed drifts over minutes.",
        f"One engine per pair with k_max = {s.k_max} in adaptive mode (start-up calibration "
        "included); a fixed-k run swaps in a controller that forces k on every row (the adaptive "
        "controller keeps its own estimates across cells, as a server would). With CUDA graphs a "
        "fixed k also gets a verification graph of exactly k + 1 tokens per row (captured widths: "
        f"{data['exact_width_graphs'] or 'none'}), as an engine started with that k would have; "
        "adaptive verifies at the runner's widths (each k up to 8 at its own width k + 1). No "
        "speculation is a plain engine, up for "
        "the whole section beside each pair's engine.",
        f"Ramp: {s.ramp_requests} requests of {s.ramp_output_len} tokens (T = {RAMP_TEMPERATURE:g}, "
        f"truncated-draft pair) arrive on a token clock, one per {1 / s.ramp_rate:g} plain steps at "
        "the current batch, and leave first in first out: the batch climbs from 1 to its peak and "
        "back to 1. Tokens/s = all generated tokens / wall time of the whole ramp (prefills included); "
        f"no speculation and adaptive run side by side, then every fixed k, in "
        f"{ctx.opts.adaptive_repeats} rounds (a ramp run is short and its speed moves between runs, "
        "so the best fixed k is a median too; medians and paired ratios as in the cells).",
        f"Goals (issue 14): adaptive >= {GOAL_PLAIN}x no speculation and >= {GOAL_FIXED}x the best "
        f"fixed k in every cell; >= {GOAL_RAMP}x the best fixed k on the ramp. Execution: "
        f"{ctx.mode['description'] if ctx.mode else ('eager' if ctx.device.type == 'cpu' else 'see settings')}.",
    ] + ([f"Controller variants (A/B): {', '.join(ctx.opts.adaptive_variants)}; each runs right after "
          "adaptive in every repeat of every cell and on the ramp, on the same engine, with its own "
          "acceptance estimates and cost model (same calibration), kept across cells; its ratio to "
          "no speculation is paired the same way. The goals are judged on adaptive (the default)."]
         if ctx.opts.adaptive_variants else [])


# ---- plots ---------------------------------------------------------------------------------------
def _plots(ctx: BenchContext, data: dict, s: ad.AdaptiveSettings) -> list[str]:
    try:
        from specserve.bench.plots import _pyplot
        plt = _pyplot()
    except ImportError:
        return []
    files = []
    for pair, label in PAIRS:
        grid = data["grid"].get(pair)
        if grid is None:
            continue
        fig, axes = plt.subplots(1, len(s.temperatures), figsize=(5 * len(s.temperatures), 3.8),
                                 squeeze=False)
        for ax, t in zip(axes[0], s.temperatures):
            bs = list(s.batch_sizes)
            best = [max((grid[f"k{k}"][t][b]["tok_per_s"] or 0) for k in s.ks) for b in bs]
            for key, name, ys in (("plain", "no speculation", None), ("best", "best fixed k", best),
                                  ("adaptive", "adaptive", None)):
                ys = ys or [grid[key][t][b]["tok_per_s"] or 0 for b in bs]
                ax.plot(bs, ys, marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(bs, [str(b) for b in bs])
            ax.set_xlabel("batch size")
            ax.set_ylabel("decode tokens/s")
            ax.set_title(f"{label}, T={t:g}")
            ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"adaptive_{pair}.png"
        fig.savefig(ctx.out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    ramp = data["ramp"]
    if "adaptive" in ramp:
        configs = [c for c in ["plain"] + [f"k{k}" for k in s.ks] + ["adaptive"] if c in ramp]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
        a1.bar(range(len(configs)), [ramp[c]["tok_per_s"] or 0 for c in configs],
               color=["tab:gray"] + ["tab:blue"] * (len(configs) - 2) + ["tab:orange"])
        a1.set_xticks(range(len(configs)), ["no spec" if c == "plain" else c.replace("k", "k=")
                                            for c in configs], rotation=45)
        a1.set_ylabel("tokens/s over the ramp")
        a1.set_title("ramp 1 -> peak -> 1")
        tr = ramp["adaptive"]["trace"]
        a2.plot([p[0] for p in tr], [p[1] for p in tr], color="tab:gray", label="running requests")
        a2.set_xlabel("seconds (adaptive run)")
        a2.set_ylabel("running requests")
        a3 = a2.twinx()
        a3.plot([p[0] for p in tr], [p[2] for p in tr], color="tab:orange", label="chosen k")
        a3.set_ylabel("chosen k")
        a2.set_title("adaptive: batch and k over the ramp")
        fig.tight_layout()
        fig.savefig(ctx.out / "adaptive_ramp.png", dpi=110)
        plt.close(fig)
        files.append("adaptive_ramp.png")
    return files
