"""Where a CUDA-graph replay's time goes, kernel by kernel: torch.profiler over a few replays of a
captured forward, read back from its Chrome trace. For each kernel launch of one replay (the
median over the replays, by position in the launch order) it gives the kernel's name, grid,
duration and the idle gap before it; and per kernel name the launches, summed duration and summed
gaps. With programmatic dependent launch a kernel starts before the one ahead ends and waits
inside, so its duration includes that wait and the gaps shrink or go negative: profile with PDL
off to see each kernel alone.

Used by ``scripts/fused_layer_ab.py --profile``; ``profile_replays`` is the entry point (GPU),
``summarize`` the arithmetic (tests/bench/test_graph_kernel_profile.py).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections import defaultdict
from typing import Callable

import torch


DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")   # what a graph replay runs on the GPU


def _kernel_events(trace_path: str) -> list[dict]:
    """The trace's device activities (kernels, copies, memsets) in start order: a graph's copies
    are launches of their own, so their time is not read as the next kernel's idle gap."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e]
    return sorted(kernels, key=lambda e: e["ts"])


def profile_replays(replay: Callable[[], None], replays: int = 20) -> dict:
    """Profile ``replays`` replays of ``replay`` (a captured graph's replay, warmed up) and return
    ``{"launches": [...], "by_name": [...], "wall_us": ..., "kernel_us": ...}`` for one replay,
    each number the median over the replays."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return summarize(_kernel_events(path), replays)


def summarize(kernels: list[dict], replays: int) -> dict:
    """The kernel events of ``replays`` identical replays (Chrome-trace dicts with name, ts, dur
    and args, in start order) as one replay: see :func:`profile_replays`."""
    per = len(kernels) // replays
    if per == 0 or per * replays != len(kernels):
        raise RuntimeError(f"{len(kernels)} kernel events do not split into {replays} replays")
    runs = [kernels[i * per:(i + 1) * per] for i in range(replays)]
    names = [e["name"] for e in runs[0]]
    for run in runs[1:]:
        if [e["name"] for e in run] != names:
            raise RuntimeError("the replays did not run the same launches in the same order "
                               "(another stream's work in the trace?)")
    launches = []
    for pos in range(per):
        durs = [run[pos]["dur"] for run in runs]
        gaps = [run[pos]["ts"] - (run[pos - 1]["ts"] + run[pos - 1]["dur"]) if pos else 0.0
                for run in runs]
        first = runs[0][pos]
        launches.append({"name": first["name"], "grid": first.get("args", {}).get("grid"),
                         "block": first.get("args", {}).get("block"),
                         "dur_us": statistics.median(durs), "gap_us": statistics.median(gaps)})
    by_name: dict[str, dict] = defaultdict(lambda: {"launches": 0, "dur_us": 0.0, "gap_us": 0.0})
    for launch in launches:
        row = by_name[launch["name"]]
        row["launches"] += 1
        row["dur_us"] += launch["dur_us"]
        row["gap_us"] += launch["gap_us"]
    walls = [run[-1]["ts"] + run[-1]["dur"] - run[0]["ts"] for run in runs]
    return {"launches": launches,
            "by_name": sorted(({"name": k, **v} for k, v in by_name.items()),
                              key=lambda r: -r["dur_us"]),
            "wall_us": statistics.median(walls),
            "kernel_us": sum(x["dur_us"] for x in launches)}


def report(title: str, prof: dict, show_first: int = 16, show_last: int = 6) -> str:
    """Markdown: the per-name table, then the first and last launches of one replay."""
    lines = [f"### {title}",
             f"one replay: {prof['wall_us']:.1f} us first kernel start to last kernel end; "
             f"kernels {prof['kernel_us']:.1f} us summed; {len(prof['launches'])} launches", "",
             "| kernel | launches | duration (us) | gaps before (us) | us per launch |",
             "|---|---|---|---|---|"]
    for row in prof["by_name"]:
        lines.append(f"| {row['name'][:70]} | {row['launches']} | {row['dur_us']:.1f} | "
                     f"{row['gap_us']:.1f} | {row['dur_us'] / row['launches']:.2f} |")
    lines += ["", "| # | kernel | grid | block | duration (us) | gap before (us) |",
              "|---|---|---|---|---|---|"]
    launches = prof["launches"]
    shown = list(range(min(show_first, len(launches))))
    shown += [i for i in range(max(len(launches) - show_last, 0), len(launches)) if i not in shown]
    for i in shown:
        x = launches[i]
        lines.append(f"| {i} | {x['name'][:60]} | {x['grid']} | {x['block']} | "
                     f"{x['dur_us']:.2f} | {x['gap_us']:.2f} |")
    return "\n".join(lines)
