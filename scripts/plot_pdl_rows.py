"""PDL off / on by token rows, one line per run of ``scripts/fused_layer_ab.py --switch pdl``
(its JSON: ``cells`` keyed by rows, each with the off and on seconds of every round): the
speed-up of the median on-time over the median off-time at each row count, with the band
where PDL's row rule applies (kernels/triton_pdl.LARGE_MODEL_ROWS) shaded. Writes OUT.png
and prints the table it plots.

    python scripts/plot_pdl_rows.py OUT_STEM LABEL=RUN.json [LABEL=RUN.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys


def speedups(path: str) -> dict[int, float]:
    """rows -> median off time / median on time."""
    cells = json.load(open(path))["cells"]
    return {int(rows): statistics.median(c["off"]) / statistics.median(c["on"])
            for rows, c in cells.items() if rows.isdigit()}


def main() -> None:
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specserve.kernels.triton_pdl import LARGE_MODEL_ROWS

    out = sys.argv[1]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.axvspan(LARGE_MODEL_ROWS.start - 0.5, LARGE_MODEL_ROWS.stop - 0.5, color="tab:green",
               alpha=0.12, label=f"the rule: rows {LARGE_MODEL_ROWS.start}-{LARGE_MODEL_ROWS.stop - 1}")
    ax.axhline(1.0, color="grey", lw=0.8)
    for arg in sys.argv[2:]:
        label, path = arg.split("=", 1)
        s = speedups(path)
        rows = sorted(s)
        print(f"{label}: " + ", ".join(f"{r} rows {s[r]:.3f}x" for r in rows))
        ax.plot(rows, [s[r] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted({r for arg in sys.argv[2:] for r in speedups(arg.split("=", 1)[1])})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("token rows in the forward")
    ax.set_ylabel("PDL on every kernel: off time / on time")
    ax.set_title("PDL in an 8B-like forward (H100, CUDA graph)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=120)
    print(f"wrote {out}.png")


if __name__ == "__main__":
    main()
