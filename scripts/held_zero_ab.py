"""The plain engine beside the adaptive engines held at k = 0 (self-draft, truncated draft) on the
device: the same sampled decode steps, so any difference is the adaptive engine's own host work
(or, with --profile, its kernels). Three alternating rounds; one line per round and engine: mean
ms a step and the median step.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/held_zero_ab.py --batch 64 --temperature 1 [--profile]
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
    p.add_argument("--batch", type=int, default=64, help="requests decoding together")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    p.add_argument("--steps", type=int, default=150, help="timed steps per round and engine")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    p.add_argument("--profile", action="store_true",
                   help="after the rounds, a torch.profiler table of 20 steps of each engine")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    s = ad.script_settings((a.batch,), (a.temperature,))
    dirs, cache = ad.script_models(Path("/tmp/decisions"), s, a.tiny)
    cores = {"plain": ad.build_core(cache, dirs["target"], None, s),
             "self": ad.build_core(cache, dirs["target"], dirs["target"], s),
             "mid": ad.build_core(cache, dirs["target"], dirs["mid"], s)}
    for core in cores.values():
        if core.spec_control is not None:
            ad.hold_at_zero(core.spec_control.controller)
    for rnd in range(a.rounds + (1 if a.profile else 0)):
        for name, core in cores.items():
            ids = [f"{name}{rnd}-{i}" for i in range(a.batch)]
            for rid, prompt in zip(ids, random_prompts(a.batch, 32, core.info.vocab_size, 7 + rnd)):
                core.add_request(rid, prompt, SamplingParams(temperature=a.temperature, max_tokens=400,
                                                             ignore_eos=True))
            for _ in range(12):
                core.step()
            if rnd == a.rounds:
                _profile(name, core)
            else:
                _time(name, core, rnd, a)
            core.abort(ids)


def _time(name: str, core, rnd: int, a: argparse.Namespace) -> None:
    ms, ks = [], set()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        _, st = core.step()
        ms.append(st.step_seconds * 1e3)
        ks.add(st.max_chosen_k)
    dt = (time.perf_counter() - t0) / a.steps * 1e3
    ms.sort()
    print(f"round {rnd} {name:5s} B={a.batch} T={a.temperature:g}: {dt:.3f} ms/step mean, "
          f"step p50 {ms[len(ms) // 2]:.3f}, k chosen {sorted(ks)}", flush=True)


def _profile(name: str, core) -> None:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(20):
            core.step()
    key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print(f"== {name}: 20 steps", flush=True)
    print(prof.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=70), flush=True)


if __name__ == "__main__":
    main()
