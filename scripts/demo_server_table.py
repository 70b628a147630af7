"""Measure the demo pair's acceptance per temperature through a real ``specserve serve``.

For each server mode a server is started on a free 127.0.0.1 port (``python -m specserve.server.cli serve``,
the demo pair, k=4), fixed seeded Python-code prompts are sent at each temperature, and the
spec-decode counters are taken twice: as the delta of ``/metrics`` before and after the
temperature, and as the sum of the responses' ``usage.spec_decode`` blocks. The two must agree
exactly (the script fails otherwise). Reported per temperature:

- acceptance length = 1 + accepted / drafts (tokens per target step, bonus token included);
- acceptance rate = accepted / draft tokens;
- per-position acceptance = drafts whose first i+1 tokens were accepted / drafts;
- alpha_hat = the position-0 value (the per-token acceptance of the first draft token).

Server modes:

- ``probabilistic``: accept with min(1, p/q), drafts sampled, draft probabilities stored (default);
- ``strict``: accept only when the draft equals the target's own sample (no draft probabilities;
  the draft is raced with the target's random numbers, so acceptance is the coupling's
  sum_i 1 / sum_j max(p_j / p_i, q_j / q_i), between sum p*q and sum min(p, q));
- ``greedy_draft``: ``--draft-sample-method greedy``, argmax drafts, no stored probabilities
  (probabilistic verification of a point mass: accept with p(argmax q)).

Outputs: ``--out`` (raw JSON, default docs/acceptance.json) and, unless ``--no-report``, a Markdown
table (.md) and a plot (.png) beside it, with the model card's offline (teacher-forced) predictions
for k=4 read from engine/demo/metrics.json.

    python scripts/demo_server_table.py                        # docs/acceptance.{json,md,png}
    # the model card's older table (demo_card.py renders engine/demo/server_table.json):
    python scripts/demo_server_table.py --requests 8 --concurrency 8 --max-tokens 96 \\
        --temperatures 0.3,0.5,0.7,1,1.3,1.5,2 --modes probabilistic,strict --no-report \\
        --out engine/demo/server_table.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # demo_eval (the card's alpha definitions)
K = 4  # what `specserve serve` uses for the demo pair
TEMPERATURES = (0.0, 0.5, 1.0, 1.5, 2.0)
# Python-code prompts ending mid-line (the demo tokenizer merges newline + indentation). The first
# eight are those of the model card's older run, so `--requests 8` repeats it.
PROMPTS = ("import os\n\n\ndef main(", "class Config", "def fibonacci(n):", "import numpy as np\n\n\ndef",
           "    def __init__(self", "from typing import", "def test_", "    return",
           "def read_json(path):", "class Node:\n    def", "for i in range(", "    @property\n    def")
SEED_BASE = 1000
MODES: dict[str, tuple[list[str], str]] = {
    "probabilistic": (["--rejection-sample-method", "probabilistic", "--draft-sample-method", "sample"],
                      "(a) probabilistic, sampled drafts + stored draft probs"),
    "strict": (["--rejection-sample-method", "strict"], "(b) strict, coupled drafts, no draft probs"),
    "greedy_draft": (["--draft-sample-method", "greedy"], "(c) greedy drafts, no stored probs"),
}
_METRIC = "specserve:spec_decode_num_"


# ----------------------------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, extra: list[str], threads: int, timeout: float = 180.0) -> subprocess.Popen:
    """``specserve serve`` with no model arguments (the demo pair) on 127.0.0.1:port.

    Healthy means: our process is alive, /health answers 200 and /v1/models lists "demo" (so a
    server of someone else on the same port is never measured by mistake).
    """
    cmd = [sys.executable, "-m", "specserve.server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--device", "cpu", "--no-access-log", "--log-level", "warning",
           # acceptance at k = 4 on every step: adaptive k (the default) would hold these seeded
           # sampled requests at k = 0 and choose k by cost, which is not what is measured here
           "--speculative-k", "fixed", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
                if proc.poll() is None and [m["id"] for m in models] == ["demo"]:
                    return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"server did not become healthy in {timeout:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ----------------------------------------------------------------------------------- counting

def empty_counts(k: int = K) -> dict[str, Any]:
    return {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [0] * k,
            "generation_tokens": 0}


def scrape_counts(port: int, k: int = K) -> dict[str, Any]:
    """The spec-decode counters (and generated tokens) of /metrics, summed over model names."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    c = empty_counts(k)
    names = {_METRIC + "drafts_total": "drafts", _METRIC + "draft_tokens_total": "draft_tokens",
             _METRIC + "accepted_tokens_total": "accepted",
             "specserve:generation_tokens_total": "generation_tokens"}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names:
                c[names[s.name]] += int(s.value)
            elif s.name == _METRIC + "accepted_tokens_per_pos_total":
                c["per_position"][int(s.labels["position"])] += int(s.value)
    return c


def counts_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {key: ([a - b for a, b in zip(after[key], before[key])] if isinstance(after[key], list)
                  else after[key] - before[key]) for key in after}


def usage_counts(usages: list[dict[str, Any]], k: int = K) -> dict[str, Any]:
    """The same counters summed over the responses' ``usage`` blocks."""
    c = empty_counts(k)
    for u in usages:
        s = u["spec_decode"]
        c["drafts"] += s["num_drafts"]
        c["draft_tokens"] += s["num_draft_tokens"]
        c["accepted"] += s["num_accepted_tokens"]
        c["generation_tokens"] += u["completion_tokens"]
        for i, v in enumerate(s["accepted_per_position"] or []):
            c["per_position"][i] += v
    return c


def check_agree(from_metrics: dict[str, Any], from_usage: dict[str, Any], where: str) -> None:
    """/metrics deltas must equal the summed usage blocks exactly (a plain raise: not lost under -O)."""
    if from_metrics != from_usage:
        raise AssertionError(f"{where}: /metrics delta {from_metrics} != sum of usage.spec_decode {from_usage}")


def summarize(c: dict[str, Any]) -> dict[str, Any]:
    d = max(c["drafts"], 1)
    return {**c, "acceptance_length": 1 + c["accepted"] / d,
            "acceptance_rate": c["accepted"] / max(c["draft_tokens"], 1),
            "per_position_acceptance": [v / d for v in c["per_position"]],
            "alpha_hat": c["per_position"][0] / d, "first_accepted": c["per_position"][0],
            "mean_draft_tokens_per_draft": c["draft_tokens"] / d}


# ----------------------------------------------------------------------------------- measuring

def one_request(port: int, prompt: str, temperature: float, seed: int, max_tokens: int) -> dict:
    """One completion -> {"usage": ..., "prompt_ids": [...], "output_ids": [...]}."""
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    choice = out["choices"][0]
    return {"usage": out["usage"], "prompt_ids": choice["prompt_token_ids"], "output_ids": choice["token_ids"]}


def measure_temperature(port: int, t: float, requests: int, concurrency: int,
                        max_tokens: int) -> tuple[dict, list[tuple[list[int], list[int]]]]:
    """One temperature: the seeded requests, counted from /metrics and from the usage blocks.

    Returns the summary row and each request's (prompt ids, output ids).
    """
    jobs = [(PROMPTS[i % len(PROMPTS)], SEED_BASE + i) for i in range(requests)]
    before = scrape_counts(port)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outs = list(pool.map(lambda j: one_request(port, j[0], t, j[1], max_tokens), jobs))
    seconds = time.monotonic() - start
    from_metrics = counts_delta(scrape_counts(port), before)
    check_agree(from_metrics, usage_counts([o["usage"] for o in outs]), f"T={t:g}")
    row = summarize(from_metrics)
    row["seconds"] = seconds
    row["tokens_per_second"] = row["generation_tokens"] / seconds
    return row, [(o["prompt_ids"], o["output_ids"]) for o in outs]


def measure_mode(mode: str, args: argparse.Namespace, outputs: Optional[dict] = None) -> dict[str, dict]:
    """All temperatures on one fresh server; ``outputs`` (if given) collects the token ids per T."""
    flags = MODES[mode][0]
    port = args.port or free_port()
    t0 = time.monotonic()
    proc = start_server(port, flags, args.threads)
    print(f"--- {mode}: server up on port {port} in {time.monotonic() - t0:.1f} s ({' '.join(flags)})",
          flush=True)
    rows = {}
    try:
        for t in args.temperatures:
            row, seqs = measure_temperature(port, t, args.requests, args.concurrency, args.max_tokens)
            rows[f"{t:g}"] = row
            if outputs is not None:
                outputs[f"{t:g}"] = seqs
            print(f"  T={t:g}: length {row['acceptance_length']:.2f}, rate {row['acceptance_rate']:.3f}, "
                  f"per position {[round(v, 2) for v in row['per_position_acceptance']]}, "
                  f"{row['drafts']} drafts, {row['seconds']:.1f} s (/metrics == usage: ok)", flush=True)
    finally:
        stop_server(proc)
    return rows


# ----------------------------------------------------------------------------------- theory

def offline_theory(metrics_path: Path, temps: list[float], k: int = K) -> dict[str, dict]:
    """The model card's teacher-forced E[tokens/step] for k (T=0: greedy agreement for both)."""
    if not metrics_path.exists():
        return {}
    e = json.loads(metrics_path.read_text()).get("heldout") or {}
    out = {}
    for t in temps:
        key = "greedy" if t == 0 else f"T={t:g}"
        with_probs = e.get("expected_length", {}).get(key, {}).get(str(k))
        as_one = (with_probs if t == 0 else
                  e.get("expected_length_draft_prob_as_1", {}).get(key, {}).get(str(k)))
        alpha = e.get("greedy_agreement") if t == 0 else e.get("alpha", {}).get(f"{t:g}")
        alpha1 = e.get("greedy_agreement") if t == 0 else e.get("alpha_draft_prob_as_1", {}).get(f"{t:g}")
        out[f"{t:g}"] = {"with_draft_probs": with_probs, "draft_prob_as_1": as_one,
                         "alpha_with_draft_probs": alpha, "alpha_draft_prob_as_1": alpha1}
    return out


def _load_pair() -> tuple[Any, Any]:
    """The demo target and draft through transformers (an oracle independent of the engine), fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    demo = REPO / "engine" / "demo"
    models = tuple(AutoModelForCausalLM.from_pretrained(demo / name, dtype=torch.float32,
                                                        local_files_only=True).eval()
                   for name in ("target", "draft"))
    return models[0], models[1]


def coupled_match(p, q):
    """Per row of p, q [N, V]: P(x == t) for x ~ q, t ~ p raced with the same random numbers
    (strict verification's coupled drafts): sum_i 1 / S_i, S_i = sum_j max(p_j / p_i, q_j / q_i).
    With the tokens sorted by p_j / q_j, S_i = (p-mass at ratios >= p_i / q_i) / p_i +
    (q-mass below it) / q_i: prefix sums and one binary search per token, in float64."""
    import torch

    p, q = p.double(), q.double()
    ratio = torch.where(q > 0, p / q.clamp_min(1e-300), float("inf"))              # [N, V]
    ratio, order = ratio.sort(-1)
    cum_p = torch.cumsum(p.gather(-1, order), -1)
    cum_q = torch.cumsum(q.gather(-1, order), -1)
    zero = torch.zeros_like(cum_p[:, :1])
    cum_p, cum_q = torch.cat([zero, cum_p], -1), torch.cat([zero, cum_q], -1)       # [N, V + 1]
    ok = (p > 0) & (q > 0)
    below = torch.searchsorted(ratio, torch.where(ok, p / q.clamp_min(1e-300), 0.0))  # ratios < c_i
    s = ((cum_p[:, -1:] - cum_p.gather(-1, below)) / p.clamp_min(1e-300)
         + cum_q.gather(-1, below) / q.clamp_min(1e-300))
    return torch.where(ok, 1.0 / s, 0.0).sum(-1)                                   # [N]


def own_output_theory(outputs: dict[str, list[tuple[list[int], list[int]]]], k: int = K) -> dict:
    """Teacher-forced alpha on the server's own completions (completion positions only).

    Per temperature T: the mean over generated positions of sum min(p_T, q_T), sum p_T q_T and
    the coupled match of strict verification (T = 0: argmax agreement), and
    E = (1 - a^(k+1)) / (1 - a) from each. Comparing it with the theory on held-out code separates
    "the text is different" from "the server accepts too little". The completions are exact
    samples of the target at T whichever mode produced them, so they serve every mode's theory.
    """
    import torch

    from demo_eval import expected_length

    target, draft = _load_pair()
    result = {}
    with torch.no_grad():
        for t_key, seqs in outputs.items():
            t, s_min, s_pq, s_cp, n = float(t_key), 0.0, 0.0, 0.0, 0
            for prompt_ids, output_ids in seqs:
                ids = torch.tensor([prompt_ids + output_ids[:-1]])                   # [1, len]
                sl = slice(len(prompt_ids) - 1, None)                                # predicts the outputs
                tl = target(input_ids=ids).logits[0, sl].float()                     # [outputs, vocab]
                dl = draft(input_ids=ids).logits[0, sl].float()                      # [outputs, vocab]
                if t == 0:
                    agree = (tl.argmax(-1) == dl.argmax(-1)).sum().item()
                    s_min, s_pq, s_cp = s_min + agree, s_pq + agree, s_cp + agree
                else:
                    p, q = torch.softmax(tl / t, -1), torch.softmax(dl / t, -1)      # [outputs, vocab]
                    s_min += torch.minimum(p, q).sum().item()
                    s_pq += (p * q).sum().item()
                    s_cp += coupled_match(p, q).sum().item()
                n += tl.shape[0]
            a, a1, a2 = s_min / max(n, 1), s_pq / max(n, 1), s_cp / max(n, 1)
            result[t_key] = {"num_positions": n, "alpha_with_draft_probs": a, "alpha_draft_prob_as_1": a1,
                             "alpha_coupled": a2, "with_draft_probs": expected_length(a, k),
                             "draft_prob_as_1": expected_length(a1, k), "coupled": expected_length(a2, k)}
            print(f"  own outputs T={t_key}: alpha {a:.3f}, sum p*q {a1:.3f}, E(k={k}) "
                  f"{result[t_key]['with_draft_probs']:.2f} over {n} positions", flush=True)
    return result


# ----------------------------------------------------------------------------------- report

def _f(x: Optional[float], nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _theory_columns(result: dict) -> list[tuple[str, str, str, str]]:
    """(result key, E key, short column name, legend line) of each offline column present."""
    cols = [("offline_theory", key, f"offline {tag}, held-out code",
             f"offline {tag}, held-out code: the model card's teacher-forced E for k = {K} with {what} "
             "(T = 0: a = greedy agreement)") for key, tag, what in
            (("with_draft_probs", "min(p,q)", "a = sum min(p, q)"),
             ("draft_prob_as_1", "p*q", "a = sum p*q, the draft prob taken as 1"))]
    own = result.get("own_output_theory")
    if own:
        cols += [("own_output_theory", key, f"offline {tag}, (a)'s own outputs",
                  f"offline {tag}, (a)'s own outputs: the same formula, with a measured teacher-forced (transformers, "
                  f"fp32) on the completions that server (a) returned at that temperature") for key, tag in
                 (("with_draft_probs", "min(p,q)"), ("draft_prob_as_1", "p*q"))]
        if "coupled" in next(iter(own.values())):   # JSON written before 2026-11-25 has none
            cols.append(("own_output_theory", "coupled", "offline coupled, (a)'s own outputs",
                         "offline coupled, (a)'s own outputs: the same formula with a = the coupled "
                         "match sum_i 1 / sum_j max(p_j/p_i, q_j/q_i) of strict verification's drafts, "
                         "on the same completions"))
    return cols


def _length_table(result: dict) -> list[str]:
    modes, cols = result["modes"], _theory_columns(result)
    head = ["T"] + [f"measured {MODES[m][1].split(' ')[0]}" for m in modes] + [c[2] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for t in result["temperatures"]:
        cells = [t] + [f"**{modes[m][t]['acceptance_length']:.2f}**" for m in modes]
        cells += [_f(result.get(src, {}).get(t, {}).get(key)) for src, key, _, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    legend = [f"- measured {MODES[m][1]}: through the server" for m in modes]
    legend += [f"- {c[3]}" for c in cols]
    return lines + [""] + legend


def _detail_table(result: dict) -> list[str]:
    lines = ["| mode | T | drafts | draft tokens | accepted | acceptance rate | per-position acceptance "
             "(0..k-1) | generated tokens/s |", "|---|---|---|---|---|---|---|---|"]
    for m, rows in result["modes"].items():
        for t, r in rows.items():
            pos = " / ".join(f"{v:.2f}" for v in r["per_position_acceptance"])
            lines.append(f"| {MODES[m][1].split(' ')[0]} | {t} | {r['drafts']} | {r['draft_tokens']} | "
                         f"{r['accepted']} | {r['acceptance_rate']:.3f} | {pos} | {r['tokens_per_second']:.0f} |")
    return lines


def _temps_where(result: dict, mode: str, src: str, key: str, below: bool) -> list[str]:
    rows, theory = result["modes"].get(mode, {}), result.get(src, {})
    return [t for t, r in rows.items() if theory.get(t, {}).get(key) is not None
            and (r["acceptance_length"] < theory[t][key]) == below]


def _own_output_lines(result: dict, temps: list[str]) -> list[str]:
    """A small table: how far the change of text (held-out code -> (a)'s own completions) goes."""
    held, own, rows = result["offline_theory"], result["own_output_theory"], result["modes"]["probabilistic"]
    lines = ["", "| T | alpha, held-out code | alpha, (a)'s own text | measured position-0 acceptance | "
             "E, held-out code | E, (a)'s own text | measured (a) | share of the gap explained by the text |",
             "|---|---|---|---|---|---|---|---|"]
    shares = []
    for t in temps:
        gap = held[t]["with_draft_probs"] - rows[t]["acceptance_length"]
        shares.append((held[t]["with_draft_probs"] - own[t]["with_draft_probs"]) / gap)
        lines.append(f"| {t} | {held[t]['alpha_with_draft_probs']:.3f} | {own[t]['alpha_with_draft_probs']:.3f} | "
                     f"{rows[t]['alpha_hat']:.3f} | {held[t]['with_draft_probs']:.2f} | "
                     f"{own[t]['with_draft_probs']:.2f} | {rows[t]['acceptance_length']:.2f} | {shares[-1]:.0%} |")
    rest = [t for t, sh in zip(temps, shares) if sh < 0.9]
    lines += ["", "Scored teacher-forced (transformers, fp32) on (a)'s own completions, the pair agrees less "
              "than on held-out code: that is the first cause."]
    if rest:
        worst = min(r["mean_draft_tokens_per_draft"] for r in rows.values())
        lines[-1] += (f" What is left at T = {', '.join(rest)} is the formula's independence assumption: "
                      "acceptances are correlated, and a new draft starts right after a rejected-and-resampled "
                      "token, where position 0 accepts less than the average position of the same text (compare "
                      "the third and fourth columns); drafts cut short by max_tokens cost a little more "
                      f"({worst:.2f} draft tokens per draft at worst, k = {result['num_speculative_tokens']}).")
    return lines


def _explanation(result: dict) -> list[str]:
    """Where measured (a) and (b) sit against the theory, and why, worded from the numbers."""
    if "probabilistic" not in result["modes"] or not result.get("offline_theory"):
        return []
    below = _temps_where(result, "probabilistic", "offline_theory", "with_draft_probs", True)
    above = _temps_where(result, "probabilistic", "offline_theory", "with_draft_probs", False)
    own, out = result.get("own_output_theory", {}), []
    if below:
        out.append(f"Measured (a) is below the teacher-forced prediction on held-out code at T = {', '.join(below)}. "
                   "The prediction scores the two models on real code; through the server the target continues "
                   "its *own* samples, and hot samples drift into text on which the two small models agree less.")
        if own:
            out += _own_output_lines(result, [t for t in below if t in own]) + [""]
    if above:
        out.append(f"At T = {', '.join(above)} measured (a) is at or above the held-out prediction: cool output "
                   "of a model this small repeats itself (see the card's greedy samples), and repeated text "
                   "is easy for the draft; acceptances then come in runs, which the independence assumed by "
                   "the formula does not capture.")
    modes = result["modes"]
    if "strict" in modes:
        out.append("Strict verification (b) accepts only when the draft equals the target's own sample. Its "
                   "drafts are raced with the target's own random numbers (coupled), so its theory is the "
                   "coupled column, between sum p*q (independent drafts: the rate of the "
                   "lost-draft-probabilities bug, which falls towards 1 as the temperature rises) and "
                   "sum min(p, q).")
    if "greedy_draft" in modes:
        lower = [t for t in modes["greedy_draft"] if float(t) > 0 and "probabilistic" in modes
                 and modes["greedy_draft"][t]["acceptance_length"] < modes["probabilistic"][t]["acceptance_length"]]
        out.append("Greedy drafts (c) are accepted with p(argmax q), which falls as the target's distribution "
                   "flattens" + (f"; storing no probabilities costs acceptance against (a) at T = {', '.join(lower)}."
                                 if lower else "."))
    return out


def write_markdown(result: dict, path: Path) -> None:
    k = result["num_speculative_tokens"]
    lines = [
        "# Acceptance of the demo pair through the real server", "",
        f"- Date: {result['measured']}",
        f"- Command: `{result['command']}`",
        f"- Machine: {result['machine']}, no GPU, shared with other work (load average "
        f"{result['load_average_before'][0]:.1f} before the run); the server ran {result['threads']} torch thread(s)",
        f"- k = {k} draft tokens per step",
        f"- Server: `python -m specserve.server.cli serve --device cpu --speculative-k fixed` with no model arguments (target = demo, "
        f"draft = demo, k = {k}), a fresh server per mode, on 127.0.0.1",
        f"- Load per temperature: {result['requests_per_temperature']} seeded requests (seeds "
        f"{SEED_BASE}..{SEED_BASE + result['requests_per_temperature'] - 1}, {len(result['prompts'])} "
        f"Python-code prompts), {result['max_tokens']} tokens each (ignore_eos), {result['concurrency']} "
        "at a time",
        "- Counted from /metrics (delta before/after each temperature) and checked equal to the sum of the "
        "responses' `usage.spec_decode` blocks (the script fails otherwise)",
        f"- Total time {result['seconds']:.0f} s; raw numbers in `{Path(result['json']).name}`, plot in "
        f"`{path.with_suffix('.png').name}`", "",
        "## Acceptance length (1 + accepted / drafts)", "",
        "**Bold** columns are measured through the server; *offline* columns are teacher-forced theory "
        f"E = (1 - a^(k+1)) / (1 - a) for k = {k} (independent acceptances assumed), not server measurements.", ""]
    lines += _length_table(result) + [""] + _explanation(result) + [""]
    lines += ["## Details", "", "Acceptance rate = accepted / draft tokens; per-position acceptance i = "
              "drafts whose first i+1 tokens were all accepted / drafts (from /metrics).", ""]
    lines += _detail_table(result) + [""]
    path.write_text("\n".join(lines))


def write_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps, keys = [float(t) for t in result["temperatures"]], result["temperatures"]
    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=120)
    colours = {"probabilistic": "tab:blue", "strict": "tab:orange", "greedy_draft": "tab:green"}
    for m, rows in result["modes"].items():
        ax.plot(temps, [rows[t]["acceptance_length"] for t in keys], marker="o", linewidth=2,
                color=colours[m], label="measured " + MODES[m][1])
    # each theory curve in the colour of the mode it predicts: min(p, q) -> (a), coupled -> (b);
    # p*q (independent drafts, no mode since strict drafts are coupled) in grey
    theory_colour = {"with_draft_probs": "tab:blue", "coupled": "tab:orange", "draft_prob_as_1": "tab:gray"}
    for src, key, name, _ in _theory_columns(result):
        ys = [result[src].get(t, {}).get(key) for t in keys]
        if all(y is not None for y in ys):
            style, alpha = ("--", 0.9) if src == "offline_theory" else (":", 0.7)
            ax.plot(temps, ys, linestyle=style, marker="x", color=theory_colour[key], alpha=alpha,
                    label=name.replace("offline", "theory"))
    k = result["num_speculative_tokens"]
    ax.set_xlabel("temperature")
    ax.set_ylabel("acceptance length (tokens per target step)")
    ax.set_ylim(1.0, k + 1.0)
    ax.set_title(f"demo pair through specserve serve (k = {k}, {result['machine']}); "
                 "dashed/dotted: offline theory", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------------- main

def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown modes {unknown}; known: {list(MODES)}")
    return modes


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0, help="0 (default): a free port per server")
    ap.add_argument("--requests", type=int, default=12, help="seeded requests per temperature")
    ap.add_argument("--concurrency", type=int, default=6, help="requests in flight at once")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperatures", type=_floats, default=list(TEMPERATURES))
    ap.add_argument("--modes", type=_modes, default=list(MODES))
    ap.add_argument("--threads", type=int, default=1,
                    help="the server's OMP_NUM_THREADS (one is fastest on the shared 2-core CPU)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "acceptance.json")
    ap.add_argument("--no-report", action="store_true", help="only the JSON, no .md / .png beside it")
    ap.add_argument("--render-only", action="store_true", help="re-render the .md / .png from --out")
    ap.add_argument("--no-own-output-check", action="store_true",
                    help="skip the teacher-forced alpha on the server's own completions (transformers)")
    return ap.parse_args(argv)


def write_report(result: dict, json_path: Path) -> None:
    write_markdown(result, json_path.with_suffix(".md"))
    write_plot(result, json_path.with_suffix(".png"))
    print(f"wrote {json_path.with_suffix('.md')} and {json_path.with_suffix('.png')}", flush=True)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args.render_only:  # re-render .md / .png from an existing JSON, measuring nothing
        write_report(json.loads(args.out.read_text()), args.out)
        return
    start = time.monotonic()
    temps = [f"{t:g}" for t in args.temperatures]
    result = {"command": " ".join(["python scripts/demo_server_table.py", *(sys.argv[1:] if argv is None else argv)]),
              "measured": time.strftime("%Y-%m-%d"),
              "device": "cpu (the server's default here)",
              "machine": f"{os.cpu_count()}-core CPU ({platform.machine()}, {platform.system()})",
              "load_average_before": list(os.getloadavg()), "threads": args.threads,
              "requests_per_temperature": args.requests, "concurrency": args.concurrency,
              "max_tokens": args.max_tokens, "num_speculative_tokens": K, "temperatures": temps,
              "prompts": list(PROMPTS[: min(args.requests, len(PROMPTS))]),
              "mode_flags": {m: MODES[m][0] for m in args.modes}, "modes": {},
              "offline_theory": offline_theory(REPO / "engine" / "demo" / "metrics.json", args.temperatures),
              "json": _relative(args.out)}
    outputs: dict = {}
    for mode in args.modes:
        result["modes"][mode] = measure_mode(mode, args, outputs if mode == args.modes[0] else None)
    if not args.no_own_output_check:
        print(f"--- teacher-forced alpha on the {args.modes[0]} server's own completions", flush=True)
        result["own_output_theory_mode"] = args.modes[0]
        result["own_output_theory"] = own_output_theory(outputs)
    result["seconds"] = time.monotonic() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)
    if not args.no_report:
        write_report(result, args.out)


if __name__ == "__main__":
    main()
