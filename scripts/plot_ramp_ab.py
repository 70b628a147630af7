"""Plot scripts/ramp_ab.py's JSON: tokens/s of each config in each round (left), and the batch
and the chosen k over time of adaptive's median run beside plain's batch (right).

    python scripts/plot_ramp_ab.py ramp_ab.json ramp_ab.png
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from specserve.bench.plots import _pyplot


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    data = json.loads(src.read_text())
    configs, runs = data["configs"], data["runs"]
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11.5, 4))
    for c in configs:
        ys = [r["tok_per_s"] for r in runs[c]]
        a1.plot(range(1, len(ys) + 1), ys, marker="o", label=c.replace("adaptive:", ""))
    a1.set_xlabel("round")
    a1.set_ylabel("tokens/s over the ramp")
    a1.set_title("each config once per round")
    a1.legend(fontsize=8)

    def median_run(c: str) -> dict:
        med = statistics.median_low(r["tok_per_s"] for r in runs[c])
        return next(r for r in runs[c] if r["tok_per_s"] == med)
    for c, color in (("plain", "tab:gray"), ("adaptive", "tab:orange")):
        if c in runs:
            tr = median_run(c)["trace"]
            a2.plot([p[0] for p in tr], [p[1] for p in tr], color=color, label=f"{c}: running requests")
    if "adaptive" in runs:
        a3 = a2.twinx()
        tr = median_run("adaptive")["trace"]
        a3.plot([p[0] for p in tr], [p[2] for p in tr], color="tab:red", lw=0.8, label="adaptive: chosen k")
        a3.set_ylabel("chosen k (largest in the step)")
        a3.legend(fontsize=8, loc="upper right")
    a2.set_xlabel("seconds")
    a2.set_ylabel("running requests")
    a2.set_title("median runs: batch 1 -> peak -> 1")
    a2.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(dst)


if __name__ == "__main__":
    main()
