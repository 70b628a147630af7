"""``specserve bench``: the benchmark of issue 6 (roofline, verification cost, rejection sampler,
end to end with and without speculation, the HF peer, load through the HTTP server).

``specserve.server.cli`` imports this module and calls :func:`add_subparser`. Importing it is
cheap (no torch): the measurement modules load only when the command runs.

Modules: ``options`` (flags -> BenchOptions, presets), ``context`` (what sections share: bandwidth,
models, engines), ``sections_models`` / ``sections_load`` / ``sections_sampler`` (one function per
section -> a Section table), ``report`` (goals, bench.json, bench.md), ``plots`` (PNG files),
``main`` (the run loop). The measurements themselves are the other modules of this package (see its ``__init__``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Mapping

from specserve.bench.options import add_arguments, options_from_args


def add_subparser(subparsers: "argparse._SubParsersAction") -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark speed against the physical limit and peers (JSON + Markdown + plots)",
        description="Measure batch-1 decode against the bandwidth roofline, verification and draft "
                    "step costs, the rejection sampler, end-to-end speed-up vs E/(kc+1), HF "
                    "assisted generation, and load through the HTTP server. Writes OUT/bench.json, "
                    "OUT/bench.md and OUT/*.png.")
    add_arguments(p)
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        opts = options_from_args(args)
    except ValueError as e:
        print(f"specserve bench: error: {e}", file=sys.stderr)
        return 2
    from specserve.bench.main import run

    return run(opts, command=shlex.join(["specserve", *sys.argv[1:]]) if sys.argv else "specserve bench")


def main(argv: list[str] | None = None) -> int:
    """``python -m specserve.bench.cli ...``: the same flags, without importing the server (a
    machine without fastapi / uvicorn can run every section but ``serve``)."""
    p = argparse.ArgumentParser(prog="specserve bench")
    add_arguments(p)
    return run_bench(p.parse_args(argv), {})


if __name__ == "__main__":
    sys.exit(main())
