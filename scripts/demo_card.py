"""Render the demo pair's MODEL_CARD.md from its metrics.json (and optionally time CPU decoding).

    python scripts/demo_card.py engine/demo/metrics.json --cpu-bench   # rewrites MODEL_CARD.md

``--cpu-bench`` loads the target and draft beside metrics.json on the CPU (2 threads), times a
256-token greedy completion of each with transformers' generate and records it in metrics.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

KS = ("3", "4", "5")


def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _arch_table(m: dict) -> list[str]:
    rows = ["| | target | draft |", "|---|---|---|"]
    a, p = m.get("architecture", {}), m.get("params", {})
    t, d = a.get("target", {}), a.get("draft", {})
    for key, label in (("layers", "layers"), ("hidden", "hidden size"), ("heads", "attention heads"),
                       ("kv_heads", "KV heads"), ("ff", "MLP size"), ("vocab", "vocabulary")):
        rows.append(f"| {label} | {t.get(key)} | {d.get(key)} |")
    rows.append(f"| parameters (tied embeddings) | {p.get('target', 0) / 1e6:.2f}M | {p.get('draft', 0) / 1e6:.2f}M |")
    s = m.get("sizes_bytes", {})
    rows.append(f"| directory size | {s.get('target', 0) / 1e6:.2f} MB | {s.get('draft', 0) / 1e6:.2f} MB |")
    return rows


def _corpus_section(c: dict) -> list[str]:
    lines = [
        f"- {c.get('train_bytes', 0) / 1e6:.1f} MB of training text in {c.get('train_files')} files "
        f"({c.get('train_tokens', 0) / 1e6:.1f}M tokens); {c.get('heldout_bytes', 0) / 1e6:.2f} MB in "
        f"{c.get('heldout_files')} held-out files ({c.get('heldout_tokens', 0) / 1e3:.0f}k tokens).",
        f"- Source: every `.py` file of the Python standard library and the installed packages under "
        f"{', '.join(f'`{r}`' for r in c.get('roots', []))} on the training machine ({c.get('candidate_files')} "
        "files), filtered (64 B to 200 kB, UTF-8, not data-like), de-duplicated by content, shuffled with "
        "the seed; the first files of the shuffle are held out.",
        f"- {100 * c.get('chat_fraction', 0):.0f}% of the training files are wrapped in the chat template "
        "(a one-line user request naming the module, the file as the answer).",
        "", "Sources by bytes of training text, with the licence read from their metadata "
        "(all sources are in metrics.json):", "", "| source | MB | licence |", "|---|---|---|"]
    lic = c.get("licences", {})
    items = list(c.get("bytes_by_source", {}).items())
    for name, n in items[:30]:
        lines.append(f"| {name} | {n / 1e6:.2f} | {lic.get(name, 'unknown')} |")
    rest = items[30:]
    if rest:
        lines.append(f"| {len(rest)} other sources | {sum(n for _, n in rest) / 1e6:.2f} | see metrics.json |")
    return lines


def _training_section(m: dict) -> list[str]:
    h, a = m.get("hardware", {}), m.get("args", {})
    lines = [f"- Command: `{m.get('command')}`",
             f"- Hardware: {h.get('gpu', h.get('device'))}; torch {h.get('torch')}, transformers "
             f"{h.get('transformers')}, tokenizers {h.get('tokenizers')}, Python {h.get('python')}.",
             f"- Seed {a.get('seed')}; sequences of {a.get('seq_len')} tokens, {a.get('batch_size')} per step; "
             f"AdamW (0.9, 0.95), weight decay 0.1, peak LR {a.get('lr')}, {a.get('warmup')} warm-up steps, "
             "cosine to 10%; bf16 autocast, fp32 master weights, saved in bf16.",
             f"- Draft loss: {a.get('kd_weight')} x KL(target || draft) + {1 - float(a.get('kd_weight', 0)):.1f} x "
             "cross-entropy at T = 1, the teacher being the saved bf16 target.",
             f"- Total wall time of the script: {m.get('total_seconds', 0):.0f} s.", "",
             "| | steps | tokens seen | seconds | final train loss |", "|---|---|---|---|---|"]
    for name in ("target", "draft"):
        t = m.get(f"{name}_training", {})
        lines.append(f"| {name} | {t.get('steps')} | {t.get('tokens_seen', 0) / 1e6:.0f}M | "
                     f"{t.get('seconds', 0):.0f} | {_f(t.get('final_train_loss'))} |")
    lines.append("")
    lines.append(f"Replay exactly: add `--target-steps {m.get('target_training', {}).get('steps')} "
                 f"--draft-steps {m.get('draft_training', {}).get('steps')}` to the command.")
    return lines


def _alpha_table(e: dict) -> list[str]:
    temps = list(e.get("alpha", {}))
    lines = ["| temperature | " + " | ".join(temps) + " |", "|---|" + "---|" * len(temps),
             "| alpha with draft probs, sum min(p, q) | " + " | ".join(_f(e["alpha"][t]) for t in temps) + " |",
             "| alpha if draft prob taken as 1, sum p*q | "
             + " | ".join(_f(e["alpha_draft_prob_as_1"][t]) for t in temps) + " |"]
    for k in KS:
        lines.append(f"| E[tokens/step], k={k}, with draft probs | "
                     + " | ".join(_f(e["expected_length"][f"T={t}"][k], 2) for t in temps) + " |")
    for k in KS:
        lines.append(f"| E[tokens/step], k={k}, draft prob as 1 | "
                     + " | ".join(_f(e["expected_length_draft_prob_as_1"][f"T={t}"][k], 2) for t in temps) + " |")
    return lines


def _eval_section(m: dict) -> list[str]:
    e = m.get("heldout")
    if not e:
        return ["Evaluation did not run: " + str(m.get("evaluation_error", "no result"))]
    g = e["expected_length"]["greedy"]
    lines = [f"Teacher-forced over {e['num_tokens']} held-out tokens (windows of "
             f"{m.get('args', {}).get('eval_window')} tokens), saved bf16 weights computed in fp32.", "",
             "| | target | draft |", "|---|---|---|",
             f"| held-out loss (nats/token) | {_f(e['target_loss'])} | {_f(e['draft_loss'])} |",
             f"| held-out perplexity | {_f(e['target_ppl'], 2)} | {_f(e['draft_ppl'], 2)} |", "",
             f"Greedy agreement (argmax target == argmax draft): **{_f(e['greedy_agreement'])}**; "
             f"expected tokens per target step for greedy requests: k=3 {g['3']:.2f}, k=4 {g['4']:.2f}, "
             f"k=5 {g['5']:.2f}.", "",
             "Acceptance per temperature (E = (1 - a^(k+1)) / (1 - a), independent acceptances assumed):", ""]
    lines += _alpha_table(e)
    s = m.get("snippet")
    if s:
        lines += ["", f"On the fixed snippet `{s.get('path')}` ({s['num_tokens']} tokens; checked by "
                  f"`tests/engine/test_demo_pair.py`): greedy agreement {_f(s['greedy_agreement'])}, "
                  f"alpha(T=1) {_f(s['alpha']['1'])}, sum p*q at T=1 {_f(s['alpha_draft_prob_as_1']['1'])}, "
                  f"target loss {_f(s['target_loss'])}, draft loss {_f(s['draft_loss'])}."]
    return lines


def _extras(m: dict) -> list[str]:
    lines = []
    cpu = m.get("cpu_decode")
    if cpu:
        lines += ["## CPU decoding", "",
                  f"transformers `generate`, greedy, batch 1, {cpu['threads']} threads on {cpu['cpu']}: "
                  f"a {cpu['tokens']}-token completion takes {cpu['target_seconds']:.1f} s with the target "
                  f"({cpu['tokens'] / cpu['target_seconds']:.0f} tokens/s) and {cpu['draft_seconds']:.1f} s "
                  "with the draft.", ""]
    if m.get("samples"):
        lines += ["## Greedy samples from the target", ""]
        for prompt, text in m["samples"].items():
            lines += ["```", (prompt + text).replace("```", "'''"), "```", ""]
    return lines


def render(m: dict) -> str:
    """The model card as Markdown."""
    total = m.get("sizes_bytes", {}).get("total", 0)
    lines = ["# specserve demo pair: target + draft", "",
             "A small Llama-style target and a much smaller draft, trained by "
             "`scripts/train_demo_pair.py` on Python source code, shipped inside the package so that "
             "`specserve serve` with no arguments serves Python-looking text with real acceptance rates. "
             "It is a demonstration, not a useful code model.",
             "", f"Both directories together: {total / 1e6:.2f} MB (bf16 safetensors, shared byte-level BPE "
             "tokenizer with `<|endoftext|>` as eos/bos/pad, a `<|user|>` / `<|assistant|>` / `<|end|>` chat "
             "template, generation_config eos = `<|endoftext|>`, `<|end|>`).", "",
             "## Architecture", "", "LlamaForCausalLM, tied input/output embeddings, RoPE (theta 10000), "
             "RMSNorm, SwiGLU, context 2048 (trained on 1024-token windows).", ""]
    lines += _arch_table(m) + ["", "## Corpus", ""] + _corpus_section(m.get("corpus", {}))
    lines += ["", "## Training", ""] + _training_section(m) + ["", "## Evaluation", ""] + _eval_section(m)
    lines += [""] + _extras(m)
    lines += ["## Limits", "", "Trained for a few minutes on a few hundred MB-epochs of library code: output "
              "looks like Python and rarely runs. The licences above are those the packages declare; the "
              "weights are a statistical summary of that code, shipped for demonstration only."]
    return "\n".join(lines).rstrip() + "\n"


def cpu_bench(model_dir: Path, tokens: int = 256, threads: int = 2) -> dict:
    """Time a greedy ``tokens``-token completion of target and draft on the CPU."""
    import platform

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir / "target")
    ids = torch.tensor([tok.encode("import os\n\n\ndef main(")])
    out = {"threads": threads, "tokens": tokens, "cpu": platform.processor() or platform.machine()}
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(model_dir / name, dtype=torch.float32).eval()
        model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)   # warm-up
        t0 = time.perf_counter()
        model.generate(input_ids=ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        out[f"{name}_seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="render MODEL_CARD.md beside a metrics.json")
    ap.add_argument("metrics", type=Path)
    ap.add_argument("--cpu-bench", action="store_true")
    args = ap.parse_args()
    m = json.loads(args.metrics.read_text())
    if args.cpu_bench:
        m["cpu_decode"] = cpu_bench(args.metrics.parent)
        args.metrics.write_text(json.dumps(m, indent=2) + "\n")
    (args.metrics.parent / "MODEL_CARD.md").write_text(render(m))


if __name__ == "__main__":
    main()
