"""Where an adaptive drafting step's host time goes, beside a fixed-k step: the bench's adaptive
engine (Qwen3-1.7B-like dummy target, truncated draft) decodes one cell at the given batch and
temperature, adaptive and then at a fixed k, each under cProfile, and prints each run's
microseconds a decode step by function (own time), then the functions whose time a step differs
most between the two. cProfile slows Python several times over, so read the differences, not the
absolute numbers; GPU waits show as the own time of the call that waits (``item``,
``synchronize``, ``tolist``).

    PYTHONPATH=. python3 scripts/adaptive_host_profile.py [--batch 256] [--temperature 1]
        [--fixed-k 5] [--rounds 2] [--tiny]

(Checkpoints under /tmp/decisions, as scripts/adaptive_decisions.py. The profile covers each
whole run, its prefill step included, divided by its decode steps; fixed k runs at the engine's
own verification widths, without the bench's exact-width graphs.)
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
from pathlib import Path

from specserve.bench import adaptive as ad
from specserve.bench.engines import random_prompts


def own_time_per_step(prof: cProfile.Profile, steps: int) -> dict[str, float]:
    """Microseconds of own time a decode step, by "file:line(function)"."""
    stats = pstats.Stats(prof)
    out: dict[str, float] = {}
    for (path, line, name), (_, _, tottime, _, _) in stats.stats.items():   # type: ignore[attr-defined]
        key = f"{Path(path).name}:{line}({name})"
        out[key] = out.get(key, 0.0) + tottime * 1e6 / max(1, steps)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256, help="requests decoding together")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--fixed-k", type=int, default=5, help="the fixed k run beside adaptive")
    p.add_argument("--rounds", type=int, default=2, help="profiled runs of each")
    p.add_argument("--top", type=int, default=25, help="functions printed per run")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    s = ad.script_settings([a.batch], [a.temperature])
    dirs, cache = ad.script_models(Path("/tmp/decisions"), s, a.tiny)
    core = ad.build_core(cache, dirs["target"], dirs["mid"], s)
    vocab = core.info.vocab_size
    prompts = random_prompts(a.batch, s.prompt_len, vocab, 1000 * a.batch)
    n = s.output_len_for(a.batch)
    ad.generate(core, random_prompts(4, s.prompt_len, vocab, 999), a.temperature, 8, "warm")
    per_step: dict[str, dict[str, float]] = {}
    for config in ("adaptive", f"k{a.fixed_k}"):   # one unprofiled run first (graphs, estimates)
        with _config(core, config):
            ad.generate(core, prompts, a.temperature, n, f"warm-{config}")
    for r in range(a.rounds):
        for config in ("adaptive", f"k{a.fixed_k}"):
            prof = cProfile.Profile()
            with _config(core, config):
                prof.enable()
                cell = ad.generate(core, prompts, a.temperature, n, f"{config}-{r}")
                prof.disable()
            run = cell.run
            times = own_time_per_step(prof, run.decode_steps)
            for key, us in times.items():
                per_step.setdefault(config, {})
                per_step[config][key] = per_step[config].get(key, 0.0) + us / a.rounds
            mean_k = ad.mean_k(cell.chosen_k)
            print(f"== {config} round {r}: {run.decode_tok_per_s:,.0f} tok/s (profiled), "
                  f"{run.decode_steps} decode steps, {run.decode_seconds / max(1, run.decode_steps) * 1e3:.2f} "
                  f"ms a step, acceptance {run.spec.acceptance_length}"
                  + ("" if mean_k is None else f", mean k {mean_k:.2f}"))
            for key, us in sorted(times.items(), key=lambda kv: -kv[1])[:a.top]:
                print(f"  {us:9.1f} us  {key}")
    ada, fixed = per_step["adaptive"], per_step[f"k{a.fixed_k}"]
    diff = {k: ada.get(k, 0.0) - fixed.get(k, 0.0) for k in set(ada) | set(fixed)}
    print(f"== own time a step, adaptive minus k = {a.fixed_k} (mean of {a.rounds} rounds): "
          f"total {sum(ada.values()) - sum(fixed.values()):+.1f} us")
    for key, us in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:a.top]:
        print(f"  {us:+9.1f} us  {key}  (adaptive {ada.get(key, 0.0):.1f}, fixed {fixed.get(key, 0.0):.1f})")


def _config(core, config: str):
    return ad.fixed_k(core, int(config[1:]), {}) if config.startswith("k") else contextlib.nullcontext()


if __name__ == "__main__":
    main()
