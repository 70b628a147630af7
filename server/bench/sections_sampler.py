"""Section 3: the rejection sampler, measured by ``benchmarks/rejection_sampler.py`` (its author's
benchmark; called here, not duplicated) and judged against the issue's goals."""

from __future__ import annotations

from pathlib import Path

from server.bench.context import BenchContext
from server.bench.report import Column, Section

REPO_ROOT = Path(__file__).resolve().parents[2]


def sampler(ctx: BenchContext) -> Section:
    title = "Rejection sampler: time and bytes moved"
    if not (REPO_ROOT / "benchmarks" / "rejection_sampler.py").exists():
        return Section("sampler", title, [Column("label", "Row", "str")],
                       skipped="benchmarks/rejection_sampler.py is not in this checkout")
    raise NotImplementedError("sampler adapter pending")
