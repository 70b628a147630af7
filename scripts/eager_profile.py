"""Why an eager forward costs what it costs, and what a ragged CUDA graph of it costs: the
bench's Qwen3-1.7B-like dummy target and its 0.6B-like and 4-layer drafts (section adaptive's models), eager forwards (no CUDA graph: prefill
chunks, mixed steps and the draft's catch-up run this way) of a few shapes, each timed wall-clock
(synchronised), with its device kernels (torch.profiler: count and summed duration) and the host
functions that cost the most (cProfile). Wall minus kernel time is what the host adds. Each shape
runs eagerly and then through the runner's ragged CUDA graphs (engine/runner/ragged_graphs.py).

    OUT=DIR PYTHONPATH=. python3 scripts/eager_profile.py [--tiny]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from pathlib import Path

import torch

from specserve.bench import adaptive as ad
from specserve.engine.runner.inputs import ForwardItem


def timed(fn, cuda: bool, repeats: int = 10) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def kernels(fn, cuda: bool) -> tuple[int, float]:
    if not cuda:
        return 0, 0.0
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    return len(evs), sum(e.device_time for e in evs) / 1e3   # us -> ms


def host_top(fn, n: int = 14) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(n)
    return "\n".join(line for line in s.getvalue().splitlines() if line.strip())[-3000:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = p.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    s = ad.script_settings((1, 16), (0.0,), ks=(1, 2, 3, 4), output_len=32, ramp_requests=16,
                           ramp_output_len=16)
    dirs, cache = ad.script_models(Path("/tmp/eager"), s, a.tiny)
    report = []
    for pair in ("unrelated", "mid"):
        core = ad.build_core(cache, dirs["target"], dirs[pair], s)
        runner = core.runner
        cuda = runner.device.type == "cuda"
        vocab = runner.vocab_size
        for which, rows, tokens, logits in (("draft", 1, 32, 0), ("draft", 1, 128, 0), ("draft", 16, 32, 0),
                                            ("target", 1, 32, 1), ("target", 4, 32, 1),
                                            ("target", 16, 32, 1), ("target", 1, 512, 1),
                                            ("target", 8, 128, 1)):
            if which == "target" and pair != "unrelated":
                continue
            per = -(-(tokens + 8) // runner.block_size)
            items = [ForwardItem([(5 + 3 * i + j) % vocab for j in range(tokens)], 0,
                                 list(range(i * per, (i + 1) * per)), logits) for i in range(rows)]

            def fn(which=which, items=items):
                return runner._draft_forward(items) if which == "draft" else runner._forward("target", items)

            ragged = runner.ragged
            for mode in ("eager", "ragged graph"):
                if mode == "ragged graph" and not ragged:
                    continue
                runner.ragged = ragged if mode == "ragged graph" else {}
                try:
                    wall = timed(fn, cuda)
                    n, dev = kernels(fn, cuda)
                    top = host_top(fn) if rows == 1 and tokens == 32 and mode == "eager" else None
                finally:
                    runner.ragged = ragged
                line = (f"{pair:9s} {which:6s} rows {rows:3d} x {tokens:4d} tokens, {mode:12s}: wall "
                        f"{wall * 1e3:7.2f} ms, {n} kernels, device {dev:6.2f} ms, host beyond device "
                        f"{wall * 1e3 - dev:6.2f} ms")
                print(line, flush=True)
                report.append(line)
                if top:
                    report.append(top)
                    print(top, flush=True)
        core = None
    (out / "eager_profile.txt").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
