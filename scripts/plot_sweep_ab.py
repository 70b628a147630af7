"""Two labels of rejection-sampler sweep logs (``python -m specserve.bench.rejection_sampler
--sweep`` lines ``B=... k=... LABEL ... us``, any number of runs in one log) side by side: for
each (B, k) the median microseconds of each label over the runs, the runs themselves, and the
ratio, as a markdown table (printed and written to OUT.md) and a bar plot of the ratio (OUT.png).

    python scripts/plot_sweep_ab.py LOG BEFORE_LABEL AFTER_LABEL OUT_STEM
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict


def parse(path: str) -> dict[tuple[int, int, str], list[float]]:
    """(B, k, label) -> microseconds, one per run, in log order."""
    times: dict = defaultdict(list)
    for line in open(path):
        m = re.match(r"B=\s*(\d+) k=(\d+) (\S+)\s+([\d.]+) us", line)
        if m:
            times[(int(m[1]), int(m[2]), m[3])].append(float(m[4]))
    return times


def table(times: dict, before: str, after: str) -> tuple[list[str], list[tuple[str, float]]]:
    lines = [f"| B | k | {before} (us) | {after} (us) | {after} / {before} |", "|---|---|---|---|---|"]
    ratios = []
    cells = sorted({(b, k) for b, k, lab in times if lab == before and (b, k, after) in times})
    for b, k in cells:
        t0, t1 = times[(b, k, before)], times[(b, k, after)]
        m0, m1 = statistics.median(t0), statistics.median(t1)
        runs = lambda ts: ", ".join(f"{t:.1f}" for t in ts)  # noqa: E731
        lines.append(f"| {b} | {k} | {m0:.1f} ({runs(t0)}) | {m1:.1f} ({runs(t1)}) | {m1 / m0:.2f}x |")
        ratios.append((f"B={b}\nk={k}", m1 / m0))
    return lines, ratios


def main(log: str, before: str, after: str, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, ratios = table(parse(log), before, after)
    text = "\n".join(lines)
    print(text)
    with open(out + ".md", "w") as f:
        f.write(text + "\n")
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.bar(range(len(ratios)), [r for _, r in ratios],
           color=["tab:green" if r < 1 else "tab:red" for _, r in ratios])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(ratios)), [c for c, _ in ratios], fontsize=7)
    ax.set_ylabel(f"time {after} / {before}")
    ax.set_title(f"Rejection sampler: {after} against {before} (median of runs; below 1 is faster)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    main(*sys.argv[1:5])
