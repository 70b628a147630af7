"""CPU check of adaptive k (issue 14): decode tokens/s without speculation, with fixed k and with
adaptive k, for the embedded demo pair and for an unrelated random draft on the demo tokenizer,
at batch 1 and 16. Prints a markdown table (docs/speculation.md keeps one).

    python scripts/adaptive_cpu.py [--output-len 64] [--repeats 3] [--json out.json]

The random draft is the demo draft's architecture with freshly initialised weights
(transformers ``from_config``, seed 0) saved beside a copy of the demo tokenizer: same vocabulary,
acceptance near 0. Prompts are slices of a held-out Python file (the demo pair's domain), greedy,
``ignore_eos``. All five engines stay up; each repeat runs every engine once, one after
another, and a cell's ratio is the median over repeats of its run over the no-spec run of the
same repeat (the machine's speed drifts; side-by-side runs cancel most of it). tok/s columns are
medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def random_draft(dest: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specserve.engine import demo

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(demo.DRAFT_DIR, local_files_only=True)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(dest)
    for f in Path(demo.DRAFT_DIR).iterdir():
        if "token" in f.name or f.name == "special_tokens_map.json":
            shutil.copy(f, dest / f.name)
    return str(dest)


def prompts(tokenizer, batch: int, length: int = 48) -> list[list[int]]:
    text = (REPO / "tests" / "data" / "heldout_snippet.py").read_text()
    ids = tokenizer.encode(text)
    step = max(1, (len(ids) - length) // max(batch, 1))
    return [ids[i * step:i * step + length] for i in range(batch)]


def run_once(core, batch: int, output_len: int, tag: str) -> dict:
    from specserve.bench.engines import run_generation

    run = run_generation(core, prompts(core.tokenizer, batch), output_len, tag)
    return {"tok_per_s": run.decode_tok_per_s, "acceptance_length": run.spec.acceptance_length}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--variants", default="", help="A/B: controller variants (specserve.bench.adaptive."
                    "VARIANTS, comma-separated), each an adaptive engine of its own per draft")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from specserve.bench.adaptive import variant_controllers
    from specserve.engine.core import EngineCore
    from specserve.engine.llm import make_config

    tmp = Path(tempfile.mkdtemp(prefix="adaptive-cpu-"))
    drafts = {"demo draft": "demo", "random draft": random_draft(tmp / "random-draft")}
    common = dict(device="cpu", dtype="float32", max_num_seqs=max(args.batches), seed=0)
    results = []
    t0 = time.monotonic()
    engines = {("no spec", "plain"): EngineCore(make_config("demo", **common))}
    variants = [v for v in args.variants.split(",") if v]
    for name, draft in drafts.items():
        for mode in ["fixed", "adaptive"] + [f"adaptive:{v}" for v in variants]:
            engines[(name, mode)] = core = EngineCore(make_config(
                "demo", draft_model=draft, num_speculative_tokens=args.k,
                speculative_k=mode.split(":")[0], **common))
            if ":" in mode:   # the variant's controller in place of the default one
                core.spec_control.controller = variant_controllers(core, (mode.split(":")[1],))[mode]
    for b in args.batches:
        runs: dict = {key: [] for key in engines}
        for key, core in engines.items():
            run_once(core, b, 8, f"{key[1]}{b}-warm")
        counts_before = {key: list(core.spec_control.controller.chosen_counts)
                         for key, core in engines.items() if core.spec_control is not None}
        for r in range(args.repeats):
            for key, core in engines.items():
                runs[key].append(run_once(core, b, args.output_len, f"{key[1]}{b}-{r}"))
        plain = [x["tok_per_s"] for x in runs[("no spec", "plain")]]
        for (name, mode), got in runs.items():
            if mode == "plain":
                continue
            counts = engines[(name, mode)].spec_control.controller.chosen_counts
            tps = [x["tok_per_s"] for x in got]
            results.append({"draft": name, "mode": mode, "batch": b,
                            "no_spec_tok_per_s": statistics.median(plain),
                            "tok_per_s": statistics.median(tps), "runs": tps, "no_spec_runs": plain,
                            "ratio": statistics.median(t / p for t, p in zip(tps, plain)),
                            "acceptance_length": got[-1]["acceptance_length"],
                            "chosen_k": [a - c for a, c in zip(counts, counts_before[(name, mode)])]})
            cost = engines[(name, mode)].spec_control.controller.cost
            stalls = ""
            if cost is not None:   # (the engine's total so far: every batch it has run)
                stalls = f", device stalls skipped so far {cost.device_stalls}"
            print(f"{name:12s} {mode:8s} batch {b:3d}: {results[-1]['tok_per_s']:8.1f} tok/s "
                  f"(plain {results[-1]['no_spec_tok_per_s']:.1f}) {results[-1]['ratio']:.2f}x "
                  f"chosen k {results[-1]['chosen_k']}{stalls}", file=sys.stderr, flush=True)
    print(f"\n| Draft | k | Batch | tok/s no spec | tok/s | ratio | E (accept len) | chosen k counts 0..{args.k} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        k = f"fixed {args.k}" if r["mode"] == "fixed" else r["mode"]
        e = "n/a" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        print(f"| {r['draft']} | {k} | {r['batch']} | {r['no_spec_tok_per_s']:.1f} | {r['tok_per_s']:.1f} "
              f"| {r['ratio']:.2f}x | {e} | {r['chosen_k'] if r['mode'] != 'fixed' else ''} |")
    print(f"\n({time.monotonic() - t0:.0f} s, output {args.output_len} tokens, "
          f"median of {args.repeats} side-by-side repeats)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
