"""The plain engine beside the adaptive engines held at k = 0 (self-draft, truncated draft) on the
device: the same sampled decode steps, so any difference is the adaptive engine's own host work
(or, with --profile, its kernels). Three alternating rounds; one line per round and engine: mean
ms a step and the median step.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/held_zero_ab.py --batch 64 --temperature 1 [--profile]
        [--host-profile] [--engines plain,mid] [--outputs both]
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
    p.add_argument("--host-profile", action="store_true",
                   help="after the rounds, a cProfile table of 100 steps of each engine's host work")
    p.add_argument("--engines", default="plain,self,mid",
                   help="comma-separated engines: plain (no draft), self (self-draft), mid (truncated draft)")
    p.add_argument("--outputs", choices=("each-step", "final-only", "both"), default="each-step",
                   help="the requests' outputs: built after every step (as a stream reads them), "
                        "only when they finish (EngineCore.add_request final_only, as LLM.generate "
                        "asks), or both, each engine once each way per round")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    unknown = set(a.engines.split(",")) - {"plain", "self", "mid"}
    if unknown:
        p.error(f"--engines: unknown {sorted(unknown)}; choose from plain, self, mid")
    s = ad.script_settings((a.batch,), (a.temperature,))
    dirs, cache = ad.script_models(Path("/tmp/decisions"), s, a.tiny)
    drafts = {"plain": None, "self": dirs["target"], "mid": dirs["mid"]}
    cores = {e: ad.build_core(cache, dirs["target"], drafts[e], s) for e in a.engines.split(",")}
    for core in cores.values():
        if core.spec_control is not None:
            ad.hold_at_zero(core.spec_control.controller)
    finals = {"each-step": (False,), "final-only": (True,), "both": (False, True)}[a.outputs]
    runs = [(f"{e}{'/final' if f else ''}", core, f) for e, core in cores.items() for f in finals]
    extra = int(a.profile) + int(a.host_profile)
    for rnd in range(a.rounds + extra):
        for name, core, final_only in runs:
            ids = [f"{name}{rnd}-{i}" for i in range(a.batch)]
            for rid, prompt in zip(ids, random_prompts(a.batch, 32, core.info.vocab_size, 7 + rnd)):
                core.add_request(rid, prompt, SamplingParams(temperature=a.temperature, max_tokens=400,
                                                             ignore_eos=True), final_only=final_only)
            for _ in range(12):
                core.step()
            if rnd >= a.rounds:
                if a.host_profile and rnd == a.rounds + extra - 1:
                    _host_profile(name, core)
                else:
                    _profile(name, core)
            else:
                _time(name, core, rnd, a)
            core.abort(ids)


def _time(name: str, core, rnd: int, a: argparse.Namespace) -> None:
    ms, ks, busy = [], set(), []
    t0 = time.perf_counter()
    for _ in range(a.steps):
        _, st = core.step()
        ms.append(st.step_seconds * 1e3)
        if st.host_wait_seconds is not None:   # the host's own work: the step less its wait
            busy.append((st.step_seconds - st.host_wait_seconds) * 1e3)
        ks.add(st.max_chosen_k)
    dt = (time.perf_counter() - t0) / a.steps * 1e3
    ms.sort()
    host = f", host busy {sum(busy) / len(busy):.3f} ms/step" if busy else ""
    print(f"round {rnd} {name:11s} B={a.batch} T={a.temperature:g}: {dt:.3f} ms/step mean, "
          f"step p50 {ms[len(ms) // 2]:.3f}{host}, k chosen {sorted(ks)}", flush=True)


def _host_profile(name: str, core, steps: int = 100) -> None:
    """The host's Python over ``steps`` steps by function (cProfile, own time): where an
    engine's host work goes, to set beside another's."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        core.step()
    prof.disable()
    print(f"== {name}: host functions over {steps} steps (cProfile, by own time)", flush=True)
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


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
