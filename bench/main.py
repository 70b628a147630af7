"""The run loop: each requested section in order, its failure contained, outputs rewritten after
every section (a long GPU run that dies late still leaves the numbers it had)."""

from __future__ import annotations

import time
import traceback
from typing import Callable

from specserve.bench.timing import environment
from specserve.bench import sections_adaptive, sections_load, sections_models, sections_sampler
from specserve.bench.context import BenchContext
from specserve.bench.options import SECTIONS, BenchOptions
from specserve.bench.plots import make_plots
from specserve.bench.report import Section, write_outputs

SECTION_FUNCS: dict[str, Callable[[BenchContext], Section]] = {
    "roofline": sections_models.roofline,
    "verify": sections_models.verify,
    "sampler": sections_sampler.sampler,
    "e2e": sections_load.e2e,
    "peer": sections_load.peer,
    "serve": sections_load.serve,
    "adaptive": sections_adaptive.adaptive,
}
NUMBER = {name: i + 1 for i, name in enumerate(SECTIONS)}   # the numbering
TITLES = {"roofline": "Batch-1 decode vs the bandwidth roofline",
          "verify": "Verification and draft step cost at batch 1",
          "sampler": "Rejection sampler: time and bytes", "e2e": "End to end with and without speculation",
          "peer": "Peer: HF transformers assisted generation", "serve": "Throughput under load",
          "adaptive": "Adaptive k vs no speculation and fixed k"}


def _settings(ctx: BenchContext) -> dict:
    s = ctx.opts.as_dict()
    s.update(device=str(ctx.device), dtype=ctx.dtype,
             execution_mode=(ctx.mode or {}).get("description", "no engine built"))
    return s


def _run_section(ctx: BenchContext, name: str) -> Section:
    t0 = time.perf_counter()
    ctx.log(f"== section {name} ==")
    try:
        section = SECTION_FUNCS[name](ctx)
    except Exception as e:   # noqa: BLE001 - one failed section must not lose the others
        ctx.log(f"section {name} FAILED: {type(e).__name__}: {e}")
        section = Section(name, TITLES[name], [], error=f"{type(e).__name__}: {e}",
                          data={"traceback": traceback.format_exc()})
    section.seconds = time.perf_counter() - t0
    if section.error and section.rows:
        ctx.log(f"section {name} finished with errors: {section.error}")
    if section.skipped:
        ctx.log(f"section {name} skipped: {section.skipped}")
    ctx.log(f"section {name} done in {section.seconds:.1f}s")
    return section


def run(opts: BenchOptions, command: str) -> int:
    """Run the requested sections; 0 if none failed (skips are not failures), else 1."""
    ctx = BenchContext(opts)
    env = environment(ctx.device, command)
    ctx.log(f"specserve bench on {env['device']} -> {ctx.out} (sections: {', '.join(opts.sections)})")
    sections: list[Section] = []
    try:
        for name in SECTIONS:
            if name in opts.sections:
                sections.append(_run_section(ctx, name))
                write_outputs(ctx.out, env, _settings(ctx), sections, [], None, NUMBER)
    finally:
        ctx.close()
    plots, note = make_plots(sections, ctx.out) if opts.plots else ([], None)
    json_path, md_path = write_outputs(ctx.out, env, _settings(ctx), sections, plots, note, NUMBER)
    failed = [s.name for s in sections if s.error]
    ctx.log(f"wrote {json_path}, {md_path}" + (f", {len(plots)} plots" if plots else "")
            + (f"; FAILED sections: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
