"""PNG plots of the comparisons (matplotlib, Agg backend): one function per section that has one."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from specserve.bench.report import Section


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_e2e(section: Section, out: Path) -> Optional[Path]:
    """Tokens/s with and without speculation per batch size, one panel per pair."""
    pairs = {k: v for k, v in section.data.get("pairs", {}).items() if v}
    if not pairs:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 3.8), squeeze=False)
    for ax, (label, rows) in zip(axes[0], pairs.items()):
        xs = list(range(len(rows)))
        base = [r["no_spec_tok_per_s"] or 0 for r in rows]
        spec = [r["spec_tok_per_s"] or 0 for r in rows]
        ax.bar([x - 0.2 for x in xs], base, width=0.4, label="no speculation")
        ax.bar([x + 0.2 for x in xs], spec, width=0.4, label="speculation")
        for x, r in zip(xs, rows):
            for key, style, name in (("predicted_speedup", "-", "predicted E/(kc+1) (judged)"),
                                     ("predicted_speedup_from_steps", ":", "E/(kc'+1), c' from steps")):
                if r.get(key) and r["no_spec_tok_per_s"]:
                    ax.plot([x + 0.0, x + 0.4], [r[key] * r["no_spec_tok_per_s"]] * 2, color="black",
                            linestyle=style, linewidth=1.5, label=name if x == 0 else None)
        ax.set_xticks(xs, [str(r["batch"]) for r in rows])
        ax.set_xlabel("batch size")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, plt, out / "e2e_tokens_per_s.png")


def plot_verify(section: Section, out: Path) -> Optional[Path]:
    rows = section.data.get("target", {}).get("verify", [])
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["ratio_to_decode"] for r in rows], marker="o", label="as a step runs it")
    ax.plot(ks, [r["eager_ratio"] for r in rows], marker="s", linestyle="--", label="both eager")
    ax.axhline(1.10, color="red", linewidth=1, label="goal 1.10x (k = 4)")
    ax.set_xlabel("k (forward over k+1 tokens)")
    ax.set_ylabel("cost / 1-token decode")
    ax.set_title("Verification cost at batch 1", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, out / "verify_cost.png")


def plot_serve(section: Section, out: Path) -> Optional[Path]:
    levels = section.data.get("levels", [])
    if not levels:
        return None
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    cs = [lvl["concurrency"] for lvl in levels]
    a1.plot(cs, [lvl["output_tok_per_s"] for lvl in levels], marker="o")
    a1.set_xlabel("concurrency")
    a1.set_ylabel("output tokens/s")
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):   # (bodies time E2E only: None)
        pts = [(c, lvl[metric]["p50"]) for c, lvl in zip(cs, levels) if lvl[metric]["p50"] is not None]
        if pts:
            a2.plot(*zip(*pts), marker="o", label=f"{metric[:-3].upper()} p50")
    a2.set_xlabel("concurrency")
    a2.set_ylabel("ms")
    a2.legend(fontsize=8)
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
    fig.suptitle("specserve serve under load", fontsize=10)
    fig.tight_layout()
    return _save(fig, plt, out / "serve_load.png")


def plot_sampler(section: Section, out: Path) -> Optional[Path]:
    rows = [r for r in section.rows if r.get("achieved_bytes_per_s") and r.get("batch")]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for k in sorted({r["k"] for r in rows}):
        pts = sorted((r["batch"], r["achieved_bytes_per_s"] / 1e9) for r in rows if r["k"] == k)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"k = {k}")
    bw = section.data.get("bandwidth_bytes_per_s")
    if bw:
        ax.axhline(0.7 * bw / 1e9, color="red", linewidth=1, label="70% of copy bandwidth")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (requests)")
    ax.set_ylabel("GB/s")
    ax.set_title("Rejection sampler bandwidth", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, out / "sampler_bandwidth.png")


def _save(fig, plt, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


PLOTTERS: dict[str, Callable[[Section, Path], Optional[Path]]] = {
    "e2e": plot_e2e, "verify": plot_verify, "serve": plot_serve, "sampler": plot_sampler}


def make_plots(sections: list[Section], out: Path) -> tuple[list[str], Optional[str]]:
    """Plot every section that has a plotter and data; returns (files, a note if plotting failed)."""
    try:
        _pyplot()
    except ImportError:
        return [], "plots skipped: matplotlib is not installed"
    files, problems = [], []
    for s in sections:
        fn = PLOTTERS.get(s.name)
        if fn is None or s.error or s.skipped:
            continue
        try:
            path = fn(s, out)
        except Exception as e:   # noqa: BLE001 - a broken plot must not lose the measurements
            problems.append(f"{s.name}: {type(e).__name__}: {e}")
            continue
        if path is not None:
            files.append(path.name)
    return files, ("plot errors: " + "; ".join(problems)) if problems else None
