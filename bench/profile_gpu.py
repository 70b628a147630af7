"""Where a step's time goes on the GPU: device kernels (torch.profiler) next to host time.

For the dummy Qwen3-8B-like target (plain decoding and with the 0.6B-like draft, k = 4) at
batch 1, this prints per step: wall time, the summed duration of the device kernels, their
count, the largest kernels by total time, and the host functions that cost the most
(cProfile). Wall minus kernel time is what the host adds on top of the device.

    python -m specserve.bench.profile_gpu [--steps 20] [--batch 1] [--out profile.txt]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from specserve.bench import shapes
from specserve.bench.engines import ModelCache, free_device_memory, random_prompts
from specserve.engine.types import SamplingParams


def _kernel_table(prof, steps: int, top: int) -> tuple[float, float, str]:
    """(kernel seconds per step, kernels per step, a table of the largest kernels)."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time_total * 1e-6 if hasattr(ev, "device_time_total") else ev.cuda_time_total * 1e-6
            count[ev.name] += 1
    per_step = sum(total.values()) / steps
    n = sum(count.values()) / steps
    lines = [f"{'us/step':>9} {'calls/step':>10} {'us/call':>8}  kernel"]
    for name, secs in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        c = count[name] / steps
        lines.append(f"{secs / steps * 1e6:9.1f} {c:10.1f} {secs / count[name] * 1e6:8.2f}  {name[:110]}")
    return per_step, n, "\n".join(lines)


def profile_core(core, label: str, batch: int, steps: int, out) -> None:
    prompts = random_prompts(batch, 128, core.info.vocab_size, 0)
    ids = [f"{label}-{i}" for i in range(batch)]
    for rid, p in zip(ids, prompts):
        # enough tokens that no request finishes inside the 10 + 3 * steps steps, even when every
        # step commits k + 1 tokens (a self-draft accepts all)
        room = (core.runner.num_speculative_tokens + 1) * (10 + 3 * steps) + 16
        core.add_request(rid, p, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=room))
    for _ in range(10):
        core.step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        core.step()
        walls.append(time.perf_counter() - t0)
    walls.sort()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            core.step()
        torch.cuda.synchronize()
    k_s, k_n, table = _kernel_table(prof, steps, 30)
    cp = cProfile.Profile()
    cp.enable()
    for _ in range(steps):
        core.step()
    cp.disable()
    buf = io.StringIO()
    pstats.Stats(cp, stream=buf).sort_stats("tottime").print_stats(40)
    med = walls[len(walls) // 2]
    print(f"\n===== {label}: batch {batch}, median wall {med * 1e3:.3f} ms/step, device kernels "
          f"{k_s * 1e3:.3f} ms/step ({k_n:.0f} kernels), host-exposed {1e3 * (med - k_s):.3f} ms",
          file=out)
    print(table, file=out)
    print("--- host (cProfile, tottime)", file=out)
    print(buf.getvalue()[:7000], file=out)
    graphed = [(f"{which} q={q}", g) for (which, q), g in sorted(getattr(core.runner, "graphs", {}).items())]
    loop = getattr(core.runner, "draft_loop", None)
    if loop is not None and loop.graphs:
        graphed.append(("draft program", loop))
    for name, graph in graphed:
        b = graph.buckets[0]
        launches = []
        for piece in graph.graphs[b]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                piece.replay()
            launches.append((time.perf_counter() - t0) / 10)
            torch.cuda.synchronize()
        print(f"host time to launch the {name} batch-{b} graphs (pieces): "
              + " + ".join(f"{t * 1e6:.0f}" for t in launches) + " us", file=out)
    core.abort(ids)
    out.flush()


def profile_sampler(out, steps: int) -> None:
    from specserve.kernels import triton_sampling as TS

    ns = argparse.Namespace(device="cuda", vocab=151936, dtype="bfloat16", noise=1.0, temperature=1.0,
                            top_k=0, top_p=1.0, one_hot=False)
    from specserve.bench.rejection_sampler import make_inputs

    for b, k in ((1, 4), (64, 5), (256, 8)):
        x = make_inputs(b, k, ns)

        def call():
            return TS.rejection_sample(x["target"], x["cu"], x["drafts"], x["q"], *x["params"],
                                       x["seeds"], x["positions"], "probabilistic")

        call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                call()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
        k_s, k_n, table = _kernel_table(prof, steps, 12)
        print(f"\n===== rejection sampler B={b} k={k}: wall {wall * 1e6:.1f} us/call, kernels "
              f"{k_s * 1e6:.1f} us ({k_n:.0f} kernels)", file=out)
        print(table, file=out)
        out.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="steps per profiled phase")
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes to profile")
    ap.add_argument("--k", type=int, default=4, help="speculative tokens for the pair engine")
    ap.add_argument("--out", default="-", help="report file ('-': stdout)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: plain,pair,self,sampler")
    ap.add_argument("--pair", nargs=2, metavar=("TARGET", "DRAFT"),
                    help="profile these checkpoint directories (e.g. the demo pair) instead of the "
                         "dummy 8B-like / 0.6B-like shapes")
    args = ap.parse_args()
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    skip = set(filter(None, args.skip.split(",")))
    if args.pair:
        target, draft = (Path(p).resolve() for p in args.pair)
        load_format = "auto"
    else:
        tmp = Path(tempfile.mkdtemp(prefix="specserve-prof-"))
        target, draft = shapes.write_pair(tmp, shapes.QWEN3_8B_LIKE, shapes.QWEN3_06B_LIKE)
        load_format = "dummy"
    cache = ModelCache("cuda", "bfloat16", "auto", 1024, False, 0)
    mb = max(args.batch)
    blocks = mb * 80 + 8
    for flavour, d in (("plain", None), ("pair", str(draft)), ("self", str(target))):
        if flavour in skip:
            continue
        t0 = time.perf_counter()
        core = cache.core(str(target), d, args.k if d else 0, blocks, load_format, max_num_seqs=mb)
        print(f"[profile] engine {flavour} ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        for b in args.batch:
            profile_core(core, flavour, b, args.steps, out)
        core = None                   # the last reference; frozen engines are unfrozen here
        free_device_memory(torch.device("cuda"))
    if "sampler" not in skip:
        profile_sampler(out, args.steps)


if __name__ == "__main__":
    main()
