"""Decode step times on the device: the plain engine, fixed k and adaptive k with the truncated
draft (the adaptive section's Qwen3-1.7B-like dummy pair), at a few batch sizes, greedy or
sampled (--temperature). One line per (batch, configuration): mean ms a step over the timed
steps, the median step, tokens/s (and adaptive's mean k over the timed steps).

Run it once per source tree in one device call to A/B a change (PYTHONPATH picks the tree):

    PYTHONPATH=/tmp/site:$PWD python3 scripts/step_times.py --tag head
    PYTHONPATH=/tmp/site:$PWD/base python3 scripts/step_times.py --tag base
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specserve.bench import adaptive as ad
from specserve.bench.engines import random_prompts
from specserve.engine import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="run", help="label printed on every line (the tree's name)")
    p.add_argument("--batches", default="1,16,64", help="batch sizes (comma-separated)")
    p.add_argument("--steps", type=int, default=60, help="timed steps per configuration")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    p.add_argument("--configs", default="plain,k2,k4",
                   help="comma-separated: plain (no draft model), kN (fixed k = N), adaptive")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    import specserve.engine.runner.draft_loop as source
    print(a.tag, "code from", source.__file__, flush=True)
    batches = tuple(int(b) for b in a.batches.split(","))
    s = ad.script_settings(batches, (a.temperature,))
    dirs, cache = ad.script_models(Path("/tmp/decisions"), s, a.tiny)
    plain = ad.build_core(cache, dirs["target"], None, s)
    mid = ad.build_core(cache, dirs["target"], dirs["mid"], s)
    configs = [(c, plain if c == "plain" else mid, int(c[1:]) if c.startswith("k") else 0)
               for c in a.configs.split(",")]
    for b in batches:
        for name, core, k in configs:
            ctx = ad.fixed_k(core, k, {}) if k else None
            if ctx is not None:
                ctx.__enter__()
            ids = [f"{a.tag}{name}{b}-{i}" for i in range(b)]
            for rid, prompt in zip(ids, random_prompts(b, 32, core.info.vocab_size, 7)):
                core.add_request(rid, prompt, SamplingParams(temperature=a.temperature, max_tokens=400,
                                                             ignore_eos=True))
            for _ in range(12):
                core.step()
            ctl = core.spec_control.controller if core.spec_control is not None else None
            chosen = list(ctl.chosen_counts) if ctl is not None else []
            ms, tokens = [], 0
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                _, st = core.step()
                ms.append(st.step_seconds * 1e3)
                tokens += st.num_generation_tokens
            dt = time.perf_counter() - t0
            ms.sort()
            mean_k = ""
            if name == "adaptive" and ctl is not None:
                mean_k = f", mean k {ad.mean_k([n - m for n, m in zip(ctl.chosen_counts, chosen)]) or 0.0:.2f}"
            print(f"{a.tag} T={a.temperature:g} B={b:3d} {name:8s}: {dt / a.steps * 1e3:7.3f} ms/step mean, "
                  f"p50 {ms[len(ms) // 2]:7.3f}, {tokens / dt:9.1f} tok/s{mean_k}", flush=True)
            if ctx is not None:
                ctx.__exit__(None, None, None)
            core.abort(ids)


if __name__ == "__main__":
    main()
