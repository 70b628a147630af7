"""Render the demo pair's MODEL_CARD.md from its metrics.json (and optionally time CPU decoding).

    python scripts/demo_card.py engine/demo/metrics.json --cpu-bench   # rewrites MODEL_CARD.md

``--cpu-bench`` loads the target and draft beside metrics.json on the CPU (2 threads), times a
256-token greedy completion of each with transformers' generate and records it in metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

KS = ("3", "4", "5")
sys.path.insert(0, str(Path(__file__).resolve().parent))


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
    lines.append(f"The same schedule again: add `--target-steps {m.get('target_training', {}).get('steps')} "
                 f"--draft-steps {m.get('draft_training', {}).get('steps')}` to the command (same corpus "
                 "order, batches and learning rates; GPU kernels are not bit-deterministic). The run wrote "
                 "`target/`, `draft/`, metrics.json and this card, copied into `engine/demo/` (train_log.txt stays with the run).")
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


def _server_section(table: dict | None) -> list[str]:
    """The acceptance table measured through a running server (demo_server_table.py)."""
    if not table:
        return []
    modes = table["modes"]
    temps = list(next(iter(modes.values())))
    lines = ["## Measured through the server", "",
             f"`{table['command']}` ({table['measured']}, {table['device']}): `specserve serve` on this "
             f"pair with k = {table['num_speculative_tokens']}, {table['requests_per_temperature']} concurrent "
             f"seeded requests of {table['max_tokens']} tokens (ignore_eos) per temperature, counters from "
             "each response's `usage.spec_decode`. alpha = drafts whose first token was accepted / drafts; "
             "length = 1 + accepted / drafts.", "",
             "| temperature | " + " | ".join(temps) + " |", "|---|" + "---|" * len(temps)]
    names = {"probabilistic": "with draft probs (probabilistic)",
             "strict": "without draft probs (strict: draft must equal the target's sample)"}
    for mode, rows in modes.items():
        label = names.get(mode, mode)
        lines.append(f"| alpha, {label} | " + " | ".join(_f(rows[t]["alpha_hat"], 2) for t in temps) + " |")
        lines.append(f"| length, {label} | " + " | ".join(_f(rows[t]["acceptance_length"], 2) for t in temps) + " |")
    lines += ["", "Self-generated text at high temperature drifts away from real code, where the two models "
              "agree less than on the held-out files: the served alpha at T >= 1 sits below the "
              "teacher-forced one, while without draft probabilities acceptance collapses as the "
              "teacher-forced sum p*q predicts.", ""]
    return lines


def _extras(m: dict) -> list[str]:
    lines = _server_section(m.get("server_table"))
    cpu = m.get("cpu_decode")
    if cpu:
        lines += ["## CPU decoding", "",
                  f"transformers `generate` (eager, no speculation), greedy, batch 1, a {cpu['tokens']}-token "
                  f"completion on {cpu['cpu']} (load average {cpu['load_average'][0]:.1f} while measured: "
                  "other work shared the cores, so CPU seconds are the steadier figure):", "",
                  "| model | threads | wall s | CPU s | tokens/s (wall) |", "|---|---|---|---|---|"]
        for r in cpu["runs"]:
            lines.append(f"| {r['model']} | {r['threads']} | {r['wall_seconds']:.2f} | {r['cpu_seconds']:.2f} | "
                         f"{cpu['tokens'] / r['wall_seconds']:.0f} |")
        lines.append("")
    if m.get("samples"):
        lines += ["## Greedy samples from the target", "",
                  f"Source: {m.get('samples_source', 'the training run')}. Greedy decoding of a model this "
                  "small loops; sampled output (T = 0.8) is more varied. Prompts end mid-line on purpose: "
                  "a prompt ending in a newline splits the newline+indent tokens the model learned.", ""]
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
    tt = m.get("target_training", {})
    epochs = tt.get("tokens_seen", 0) / max(1, m.get("corpus", {}).get("train_tokens", 1))
    lines += ["## Limits", "",
              f"- The target saw {tt.get('tokens_seen', 0) / 1e6:.0f}M tokens (about {epochs:.1f} passes over "
              "its corpus) in a few minutes: its output looks like Python and rarely runs; greedy output loops.",
              "- Prompts that end in a newline read worse than prompts that end mid-line (no token healing: "
              "the newline and the next line's indentation are usually one token).",
              "- On a small CPU shared with other work, one torch thread decodes far faster than two "
              "(see the CPU table).",
              "- The licences above are those the packages declare in their metadata; the weights are a "
              "statistical summary of that code, shipped for demonstration only."]
    return "\n".join(lines).rstrip() + "\n"


def _load(model_dir: Path, name: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir / name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir / name)


def cpu_bench(model_dir: Path, tokens: int = 256) -> dict:
    """Time a greedy ``tokens``-token completion of target and draft on the CPU, 1 and 2 threads.

    Wall time depends on what else the machine runs; process CPU time (1 thread) does not much,
    and is what one idle core would need.
    """
    import platform

    import torch

    out = {"tokens": tokens, "cpu": platform.processor() or platform.machine(),
           "load_average": list(os.getloadavg()), "runs": []}
    before = torch.get_num_threads()
    for name in ("target", "draft"):
        model, tok = _load(model_dir, name)
        ids = torch.tensor([tok.encode("import os\n\n\ndef main(")])
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)   # warm-up
            t0, c0 = time.perf_counter(), time.process_time()
            model.generate(input_ids=ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
            out["runs"].append({"model": name, "threads": threads,
                                "wall_seconds": time.perf_counter() - t0,
                                "cpu_seconds": time.process_time() - c0})
    torch.set_num_threads(before)
    return out


def resample(model_dir: Path) -> dict[str, str]:
    """Greedy continuations of the training script's sample prompts, recomputed on the CPU."""
    import torch
    from train_demo_pair import SAMPLE_PROMPTS

    model, tok = _load(model_dir, "target")
    out = {}
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        gen = model.generate(input_ids=ids, max_new_tokens=96, do_sample=False)
        out[prompt] = tok.decode(gen[0, ids.shape[1]:].tolist(), skip_special_tokens=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="render MODEL_CARD.md beside a metrics.json")
    ap.add_argument("metrics", type=Path)
    ap.add_argument("--cpu-bench", action="store_true", help="time CPU decoding, store it in metrics.json")
    ap.add_argument("--resample", action="store_true", help="recompute the greedy samples on the CPU")
    args = ap.parse_args()
    m = json.loads(args.metrics.read_text())
    table = args.metrics.parent / "server_table.json"
    if args.cpu_bench:
        m["cpu_decode"] = cpu_bench(args.metrics.parent)
    if args.resample:
        m["samples"] = resample(args.metrics.parent)
        m["samples_source"] = "demo_card.py --resample (CPU, fp32, greedy)"
    if args.cpu_bench or args.resample:
        args.metrics.write_text(json.dumps(m, indent=2) + "\n")
    if table.exists():
        m["server_table"] = json.loads(table.read_text())
    (args.metrics.parent / "MODEL_CARD.md").write_text(render(m))


if __name__ == "__main__":
    main()
