"""Plot of this folder's runs of scripts/adaptive_cpu.py: each run's adaptive / no speculation
(and fixed k = 4 / no speculation) per cell, grouped by the code each run had.

    python docs/bench-cpu/2026-12-07-evening/plot_runs.py   # writes runs.png beside it
"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
GROUPS = [("775e71a (before)", ["base1", "full1", "full2", "full3"]),
          ("731ae2a (reference memos)", ["new1", "new2"]),
          ("afc8c28 (+ one drafting scale)", ["scale1", "scale2", "scale3", "final1", "final2"]),
          ("0482e55 (scale per bucket)", ["bucket1", "bucket2"])]
CELLS = [("demo draft", 1, 1.2), ("random draft", 1, 0.95), ("demo draft", 16, 0.95),
         ("random draft", 16, 0.95)]


def main() -> None:
    fig, axes = plt.subplots(1, len(CELLS), figsize=(4.4 * len(CELLS), 3.8), sharey=True)
    for ax, (draft, batch, goal) in zip(axes, CELLS):
        for g, (label, runs) in enumerate(GROUPS):
            for run in runs:
                rows = json.loads((HERE / f"{run}.json").read_text())
                got = {r["mode"]: r["ratio"] for r in rows if r["draft"] == draft and r["batch"] == batch}
                if "adaptive" in got:
                    ax.scatter(g, got["adaptive"], color="C0", marker="o",
                               label="adaptive" if (g, run) == (0, runs[0]) else None)
                if "fixed" in got:
                    ax.scatter(g + 0.15, got["fixed"], color="C1", marker="x",
                               label="fixed k = 4" if (g, run) == (0, runs[0]) else None)
        ax.axhline(goal, color="grey", linestyle="--", linewidth=1, label="goal")
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_title(f"{draft}, batch {batch} (goal {goal}x)")
        ax.set_xticks(range(len(GROUPS)), [label for label, _ in GROUPS], rotation=20, fontsize=7)
        ax.set_ylim(0.75 if draft == "demo draft" else 0.3, 1.45)
    axes[0].set_ylabel("x no speculation (median of 5 pairs)")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(HERE / "runs.png", dpi=110)


if __name__ == "__main__":
    main()
