"""CPU check of adaptive k (issue 14): decode tokens/s without speculation, with fixed k and with
adaptive k, for the embedded demo pair and for an unrelated random draft on the demo tokenizer,
at batch 1 and 16. Prints a markdown table (docs/speculation.md keeps one).

    python scripts/adaptive_cpu.py [--output-len 64] [--repeats 2] [--json out.json]

The random draft is the demo draft's architecture with freshly initialised weights
(transformers ``from_config``, seed 0) saved beside a copy of the demo tokenizer: same vocabulary,
acceptance near 0. Prompts are slices of a held-out Python file (the demo pair's domain), greedy,
``ignore_eos``. Each cell is the best of ``--repeats`` runs (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import shutil
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


def measure(core, batch: int, output_len: int, repeats: int, tag: str) -> dict:
    from specserve.bench.engines import run_generation

    ps = prompts(core.tokenizer, batch)
    run_generation(core, ps, 8, f"{tag}-warm")
    best = None
    for r in range(repeats):
        run = run_generation(core, ps, output_len, f"{tag}-{r}")
        if best is None or (run.decode_tok_per_s or 0) > (best.decode_tok_per_s or 0):
            best = run
    ctl = core.spec_control.controller if core.spec_control is not None else None
    return {"tok_per_s": best.decode_tok_per_s, "acceptance_length": best.spec.acceptance_length,
            "chosen_k": None if ctl is None else list(ctl.chosen_counts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from specserve.engine.core import EngineCore
    from specserve.engine.llm import make_config

    tmp = Path(tempfile.mkdtemp(prefix="adaptive-cpu-"))
    drafts = {"demo draft": "demo", "random draft": random_draft(tmp / "random-draft")}
    common = dict(device="cpu", dtype="float32", max_num_seqs=max(args.batches), seed=0)
    results = []
    t0 = time.monotonic()
    plain = EngineCore(make_config("demo", **common))
    base = {b: measure(plain, b, args.output_len, args.repeats, f"plain{b}") for b in args.batches}
    for name, draft in drafts.items():
        for mode in ("fixed", "adaptive"):
            core = EngineCore(make_config("demo", draft_model=draft, num_speculative_tokens=args.k,
                                          speculative_k=mode, **common))
            for b in args.batches:
                m = measure(core, b, args.output_len, args.repeats, f"{mode}{b}")
                results.append({"draft": name, "mode": mode, "batch": b,
                                "no_spec_tok_per_s": base[b]["tok_per_s"], **m,
                                "ratio": m["tok_per_s"] / base[b]["tok_per_s"]})
                print(f"{name:12s} {mode:8s} batch {b:3d}: {m['tok_per_s']:8.1f} tok/s "
                      f"(plain {base[b]['tok_per_s']:.1f}) {results[-1]['ratio']:.2f}x "
                      f"chosen k {m['chosen_k']}", file=sys.stderr, flush=True)
    print(f"\n| Draft | k | Batch | tok/s no spec | tok/s | ratio | E (accept len) | chosen k counts 0..{args.k} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        k = f"fixed {args.k}" if r["mode"] == "fixed" else "adaptive"
        e = "n/a" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        print(f"| {r['draft']} | {k} | {r['batch']} | {r['no_spec_tok_per_s']:.1f} | {r['tok_per_s']:.1f} "
              f"| {r['ratio']:.2f}x | {e} | {r['chosen_k'] if r['mode'] == 'adaptive' else ''} |")
    print(f"\n({time.monotonic() - t0:.0f} s, output {args.output_len} tokens, best of {args.repeats})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
