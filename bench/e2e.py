"""End to end through EngineCore: tokens/s with and without speculation, and the formula.

For each batch size the same prompts run greedily to a fixed length (``ignore_eos``) on an engine
without a draft and on one with it. Tokens/s counts the decode phase: from the step in which every
request had its first token to the end (prefill excluded, as the issue's step-cost formula has no
prefill term). The speed-up is compared with the prediction

    S = E / (k c + 1),   c = draft step cost / target step cost,

with E the measured acceptance length and c measured at that batch size on the runner's forward.
The refined ``E / (k c + v)`` also counts the verification forward's own cost (v = cost of k+1
tokens per request / cost of 1); the gap between the two says how much verification costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from specserve.bench.engines import GenerationRun, random_prompts, run_generation, time_forward
from specserve.bench.verify import draft_program_cost
from specserve.engine.core import EngineCore


@dataclass(frozen=True)
class E2ESettings:
    batch_sizes: tuple[int, ...]
    prompt_len: int
    output_len: int
    k: int
    warmup: int          # forward timing: warm-up calls
    repeats: int         # forward timing: timed calls
    seed: int = 0


def warm_up(core: EngineCore, settings: E2ESettings, tag: str) -> None:
    """Compile / capture / allocate everything the timed runs touch (smallest and largest batch)."""
    for b in sorted({min(settings.batch_sizes), max(settings.batch_sizes)}):
        prompts = random_prompts(b, settings.prompt_len, core.info.vocab_size, settings.seed + 999)
        run_generation(core, prompts, min(settings.output_len, 2 * settings.k + 4), f"{tag}-warm{b}")


def step_costs(core: EngineCore, batch: int, settings: E2ESettings) -> dict:
    """Forward costs at ``batch``: target 1 token, target k+1 tokens, draft 1 token (each request)."""
    ctx = settings.prompt_len + settings.output_len // 2
    t1 = time_forward(core, "target", batch, 1, ctx, settings.warmup, settings.repeats)
    tv = time_forward(core, "target", batch, settings.k + 1, ctx, settings.warmup, settings.repeats)
    td = time_forward(core, "draft", batch, 1, ctx, settings.warmup, settings.repeats)
    return {"target_step_s": t1.seconds, "verify_step_s": tv.seconds, "draft_step_s": td.seconds,
            "c": td.seconds / t1.seconds, "v": tv.seconds / t1.seconds,
            "graphs": t1.graph and tv.graph and td.graph}


def compare_batch(base: EngineCore, spec: EngineCore, batch: int, settings: E2ESettings,
                  base_runs: dict[int, GenerationRun]) -> dict:
    """One batch size: plain vs speculative generation, acceptance, speed-up vs prediction.

    ``base_runs`` caches plain runs by batch size: pairs that share a target (and so the same
    prompts and plain engine) measure the plain side once.
    """
    prompts = random_prompts(batch, settings.prompt_len, spec.info.vocab_size, settings.seed + batch)
    if batch not in base_runs:
        base_runs[batch] = run_generation(base, prompts, settings.output_len, f"base-b{batch}")
    base_run = base_runs[batch]
    spec_run = run_generation(spec, prompts, settings.output_len, f"spec-b{batch}")
    costs = step_costs(spec, batch, settings)
    k = settings.k
    e = spec_run.spec.acceptance_length
    measured = _ratio(spec_run.decode_tok_per_s, base_run.decode_tok_per_s)
    predicted = e / (k * costs["c"] + 1) if e is not None else None
    refined = e / (k * costs["c"] + costs["v"]) if e is not None else None
    same = sum(base_run.outputs.get(r) == t for r, t in spec_run.outputs.items())
    plain_step = base_run.decode_seconds / base_run.decode_steps if base_run.decode_steps else None
    # the costs a step really pays: the draft program per draft token over a plain engine step
    program = draft_program_cost(spec, None, settings.prompt_len + settings.output_len // 2,
                                 settings.warmup, settings.repeats, batch)
    c_step = _ratio(program["per_draft_seconds"], plain_step)
    # plain decode steps one speculative step replaced in this run: E, less what the fixed-length
    # tail (k shrinking near max_tokens) and requests finishing at different steps cost
    e_run = _ratio(base_run.decode_steps, spec_run.decode_steps)
    predicted_steps = e / (k * c_step + 1) if e is not None and c_step is not None else None
    return {
        "batch": batch, "no_spec_tok_per_s": base_run.decode_tok_per_s,
        "spec_tok_per_s": spec_run.decode_tok_per_s, "acceptance_length": e,
        "acceptance_rate": _ratio(spec_run.spec.num_accepted_tokens, spec_run.spec.num_draft_tokens),
        **costs, "measured_speedup": measured, "predicted_speedup": predicted,
        "predicted_speedup_with_verify_cost": refined,
        "measured_over_predicted": _ratio(measured, predicted),
        "draft_program_s": program["program_seconds"], "c_step": c_step,
        "predicted_speedup_from_steps": predicted_steps,
        "e_steps": e_run, "predicted_speedup_e_steps": e_run / (k * costs["c"] + 1) if e_run else None,
        "measured_over_predicted_from_steps": _ratio(measured, predicted_steps),
        "identical_greedy_outputs": f"{same}/{batch}",
        "plain_step_s": plain_step, "plain_step_over_forward": _ratio(plain_step, costs["target_step_s"]),
        "no_spec_run": base_run.as_dict(), "spec_run": spec_run.as_dict(),
    }


def compare_pair(base: EngineCore, spec: EngineCore, settings: E2ESettings,
                 progress: Callable[[str], None], label: str,
                 base_runs: dict[int, GenerationRun]) -> list[dict]:
    """Every batch size for one (target, draft) pair (see compare_batch for ``base_runs``)."""
    warm_up(spec, settings, f"{label}-spec")
    if not all(b in base_runs for b in settings.batch_sizes):
        warm_up(base, settings, f"{label}-base")
    rows = []
    for b in settings.batch_sizes:
        row = compare_batch(base, spec, b, settings, base_runs)
        progress(f"e2e {label} batch {b}: {_fmt(row['no_spec_tok_per_s'])} -> "
                 f"{_fmt(row['spec_tok_per_s'])} tok/s, E={_fmt(row['acceptance_length'])}, "
                 f"speed-up {_fmt(row['measured_speedup'])} (predicted {_fmt(row['predicted_speedup'])})")
        rows.append(row)
    return rows


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3g}"

