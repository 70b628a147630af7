"""Plot plain sampling (k = 0) before / after Tuning.last_row_race (now Tuning.plain_row_race;
its label ``no_plain_row_race`` reads as ``last_row_race=-1``) from a log of the removed
scripts/gpu_last_row_race.sh or of scripts/gpu_gemv_device_table.sh on an H100: for each batch, the tuning the sampler picks for B rows
(NARROW under 128 rows, DEFAULT from 128), with the bonus race where it was and in the row pass.

    python scripts/plot_last_row_race.py LOG OUT.png
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot_sweep_ab import parse  # noqa: E402  (scripts/, beside this file)


def main(log: str, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = parse(log)
    batches = sorted({b for b, k, _ in times if k == 0})
    # (before, after) labels of the tuning the sampler runs at B rows (WIDE_ROWS = 128)
    pick = {b: ("legacy", "narrow") if b < 128 else (("last_row_race=-1" if (b, 0, "last_row_race=-1") in times else "no_plain_row_race"), "default") for b in batches}
    before = [statistics.median(times[(b, 0, pick[b][0])]) for b in batches]
    after = [statistics.median(times[(b, 0, pick[b][1])]) for b in batches]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    x = range(len(batches))
    ax.bar([i - 0.2 for i in x], before, 0.4, label="bonus race after the accept tests (before)")
    ax.bar([i + 0.2 for i in x], after, 0.4, label="bonus race in the row pass (last_row_race=0)")
    for i, (b0, b1) in enumerate(zip(before, after)):
        ax.text(i + 0.2, b1, f"{b0 / b1:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [f"B={b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("us per call (CUDA graph replay)")
    ax.set_title("Plain sampling (k = 0), V = 151,936 bf16, median of runs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
