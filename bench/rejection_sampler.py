"""Benchmark the Triton rejection sampler (and draft sampler) against the memory roofline.

    python -m specserve.bench.rejection_sampler --out results/rejection_sampler        # GPU
    python -m specserve.bench.rejection_sampler --device cpu --out rs-smoke          # CPU smoke test
    python -m specserve.bench.rejection_sampler --sweep --out results/rs-sweep      # GPU: pick a plan

``--sweep`` times, for each (B, k), the old launch shape and kernel paths (``LEGACY``), the
default (``DEFAULT``) and one-knob variations of it (kernels.triton_sampling.Tuning: loads in
flight per step, programs per SM of the row pass and of the final race, warps, tile size,
split greedy/sampled loops, parallel accept tests), as CUDA-graph replays, and reports the
best per cell next to the default. It runs the legacy and default rows of every cell first and
the variations while ``--budget-s`` lasts (B >= 64 first), writing ``<out>.json`` / ``.md``.
On the GPU the legacy and default rows also split their device time by kernel (row pass,
final race, finalize; torch.profiler).

For every batch size B and draft count k (V = 151,936 bf16 logits by default) it reports the
median time of ``kernels.triton_sampling.rejection_sample`` twice: the call as Python makes it
(triton.testing.do_bench, host launch cost included: at small B that is most of it) and, on the
GPU, the device time alone (the call replayed as a CUDA graph, triton.testing.do_bench_cudagraph;
in the engine the launches overlap the target's forward, so this is what a step pays). Bandwidth
is computed from the device time where there is one. It also reports the bytes
the kernels move, the achieved bandwidth against a measured device copy bandwidth, and vLLM Model
Runner V2's byte estimate converted to time at that same
bandwidth. Writes ``<out>.json`` and ``<out>.md``.

Bytes counted for our kernels (V-wide rows, ``e`` = bytes per logit):
  every target row read once ............................. B (k + 1) V e
  probabilistic: the one deciding row per request read again (the rejected or the bonus
  row; usually an L2 hit, counted anyway) ................ B V e (none for plain sampling
  raced in the row pass, Tuning.plain_row_race)
  and the fp32 draft-prob row of each rejected draft ..... n_rej V 4
  the inverse-CDF search of a rejection or bonus row: the fp64 per-tile sums (2 per tile of
  the plan's block, written and read) and one tile of the row's logits (and a rejected draft's
  probs) read again (small)
  accepted drafts: one draft-prob element each, plus per-(row, chunk) partials, the output,
  params: counted exactly below, they are small.
``first_read_bytes`` leaves out the re-read rows: the HBM traffic if they hit in L2.
vLLM MRv2 estimate: 6 V per draft token + 6 V per request + 14 V per logits row (its fp32 copy
of the logits), i.e. V (6 B k + 6 B + 14 B (k + 1)) bytes.
On CPU the Triton kernels run under TRITON_INTERPRET=1 (set before they are imported) and
the timings only show that the script works.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable



def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True, help="output path stem (.json and .md are written)")
    ap.add_argument("--batch-sizes", default=None, help="comma list (default 1,8,64,256)")
    ap.add_argument("--ks", default=None, help="comma list of drafts per request (default 3,5,8)")
    ap.add_argument("--vocab", type=int, default=None, help="default 151936 (cpu: 1000)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--method", default="probabilistic", choices=["probabilistic", "strict"])
    ap.add_argument("--one-hot", action="store_true", help="no draft probs (greedy drafts)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=1.0,
                    help="draft logits = target logits + noise * N(0, 1) (sets acceptance)")
    ap.add_argument("--block", type=int, default=None, help="vocabulary tile (default: plan)")
    ap.add_argument("--chunk", type=int, default=None, help="vocabulary per program (default: plan)")
    ap.add_argument("--sweep", action="store_true", help="time candidate launch plans per (B, k)")
    ap.add_argument("--only", default=None,
                    help="--sweep: comma list of candidate labels to time (default: all, legacy "
                         "and default first), e.g. default,race_waves=16")
    ap.add_argument("--budget-s", type=float, default=45.0,
                    help="--sweep: stop starting variations after this many seconds")
    args = ap.parse_args()
    cpu = args.device == "cpu"
    args.batch_sizes = [int(x) for x in (args.batch_sizes or ("1,2" if cpu else "1,8,64,256")).split(",")]
    args.ks = [int(x) for x in (args.ks or ("1,3" if cpu else "3,5,8")).split(",")]
    args.vocab = args.vocab or (1000 if cpu else 151_936)
    return args


def _timer(device: str) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of a call: do_bench on the GPU, perf_counter on the CPU."""
    if device == "cuda":
        import triton.testing

        return lambda fn: float(triton.testing.do_bench(fn, warmup=25, rep=200,
                                                        return_mode="median"))

    def cpu_time(fn: Callable[[], object]) -> float:
        fn()
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(runs)

    return cpu_time


def copy_bandwidth(device: str, timer) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write counted)."""
    import torch

    n = (1 << 28) if device == "cuda" else (1 << 24)            # 1 GiB / 64 MiB of fp32
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3)


def make_inputs(b: int, k: int, args: argparse.Namespace) -> dict:
    """Target logits, drafts sampled from a noisy copy (so some get accepted) and q."""
    import torch

    from specserve.kernels import triton_sampling as TS

    dev, v = args.device, args.vocab
    gen = torch.Generator(device=dev).manual_seed(b * 100 + k)
    dtype = getattr(torch, args.dtype)
    rows = b * (k + 1)
    target = torch.randn(rows, v, device=dev, generator=gen) * 3                  # [B (k+1), V]
    ver = torch.arange(rows, device=dev).view(b, k + 1)[:, :k].reshape(-1)        # [B k]
    draft_logits = target[ver] + args.noise * torch.randn(b * k, v, device=dev, generator=gen)
    ones = lambda n, val, dt: torch.full((n,), val, dtype=dt, device=dev)  # noqa: E731
    params = (ones(b, args.temperature, torch.float32), ones(b, args.top_k, torch.int32),
              ones(b, args.top_p, torch.float32), ones(b, 0.0, torch.float32))
    seeds = torch.arange(b, dtype=torch.int64, device=dev) * 7 + 3
    positions = torch.zeros(b, dtype=torch.int64, device=dev)
    rep = lambda t: t.repeat_interleave(k)  # noqa: E731
    drafts, q = TS.sample_draft(draft_logits.to(dtype), *(rep(t) for t in params), rep(seeds),
                                torch.arange(k, device=dev).repeat(b), store_probs=True)
    cu = torch.arange(b + 1, dtype=torch.int32) * k                               # host-side
    return dict(target=target.to(dtype), cu=cu, drafts=drafts, q=None if args.one_hot else q,
                params=params, seeds=seeds, positions=positions, draft_logits=draft_logits.to(dtype))


def count_bytes(b: int, k: int, v: int, elt: int, n_rej: int, c: int, cr: int,
                method: str, has_q: bool, block: int = 1024,
                plain_in_row_pass: bool = False) -> tuple[int, int]:
    """(bytes our kernels read and write for one call, of which logits and draft-prob rows read
    for the first time): see the module docstring. ``c``/``cr``: chunks per row in the row pass
    and in the final race. ``plain_in_row_pass``: with no drafts at all, the row pass raced
    every row (``Tuning.plain_row_race``) and there is no final race."""
    rows = b * (k + 1)
    first = rows * v * elt                                   # every logits row once
    small = rows * c * 6 * 4 + rows * 4                      # partials + row thresholds written
    small += rows * (4 * 4 + 2 * 8)                          # per-row params loaded
    small += rows * 8 + b * k * 8                            # output + draft tokens
    again = 0
    if method == "probabilistic" and plain_in_row_pass and k == 0:
        small += b * c * 2 * 4                               # the row pass's race partials, read
    elif method == "probabilistic":
        again = b * v * elt                                  # the deciding row (rejected or bonus)
        first += n_rej * v * 4 if has_q else 0               # fp32 q row of the rejected draft
        small += b * k * (4 + elt)                           # q(x) and z[x] of each draft
        small += b * cr * (k + 1) * c * 2 * 4                # partials re-read per race chunk
        small += b * 4 + (0 if k else b * cr * 2 * 4)        # accepted counts (plain: race partials)
        if k:   # every request's last token by inverse CDF: fp64 tile sums written and read, one
            tiles = -(-v // block)                           # tile of its row read again (and
            small += b * (2 * tiles * 8 * 2 + block * elt)   # of a rejected draft's q)
            small += n_rej * block * 4 if has_q else 0
    return first + again + small, first


def vllm_mrv2_bytes(b: int, k: int, v: int) -> int:
    return v * (6 * b * k + 6 * b + 14 * b * (k + 1))


def run(args: argparse.Namespace) -> dict:
    import torch

    from specserve.kernels import triton_sampling as TS

    timer = _timer(args.device)
    bw = copy_bandwidth(args.device, timer)
    elt = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    rows_out = []
    for b in args.batch_sizes:
        for k in args.ks:
            x = make_inputs(b, k, args)
            call = lambda: TS.rejection_sample(  # noqa: E731
                x["target"], x["cu"], x["drafts"], x["q"], *x["params"], x["seeds"],
                x["positions"], args.method, block=args.block, chunk=args.chunk)
            out = call()
            n_tok = (out >= 0).sum(1)
            n_rej = int((n_tok <= k).sum())                  # requests that stopped at a rejection
            dev = torch.device(args.device)
            tuning = TS.verification_tuning(b * (k + 1))     # what the call runs
            pl = TS.plan(args.vocab, b * (k + 1), dev, args.block, args.chunk, tuning)
            pr = TS.race_plan(args.vocab, b, dev, args.block, args.chunk, tuning)
            ms = timer(call)
            dev_ms = None
            if args.device == "cuda":    # device-resident draft counts: no host copy, capturable
                cu_dev = x["cu"].to(args.device)
                dev_ms = _graph_ms(lambda: TS.rejection_sample(  # noqa: E731
                    x["target"], cu_dev, x["drafts"], x["q"], *x["params"], x["seeds"],
                    x["positions"], args.method, k, block=args.block, chunk=args.chunk))
            t_ms = dev_ms if dev_ms is not None else ms
            nbytes, first = count_bytes(b, k, args.vocab, elt, n_rej, pl.num_chunks,
                                        pr.num_chunks, args.method, x["q"] is not None, pr.block,
                                        plain_in_row_pass=tuning.races_in_row_pass(k))
            vb = vllm_mrv2_bytes(b, k, args.vocab)
            d_ms = None                  # no drafts (k = 0): no draft rows to sample
            if k:
                d_ms = timer(lambda: TS.sample_draft(x["draft_logits"][:b], *x["params"],
                                                     x["seeds"], x["positions"], True))
            rows_out.append(dict(
                B=b, k=k, V=args.vocab, dtype=args.dtype, method=args.method,
                draft_probs=x["q"] is not None, median_ms=ms, device_ms=dev_ms, bytes=nbytes,
                first_read_bytes=first,
                gbps=nbytes / (t_ms * 1e-3) / 1e9, frac_copy_bw=nbytes / (t_ms * 1e-3) / bw,
                roofline_ms=nbytes / bw * 1e3, mean_accepted=float((n_tok - 1).float().mean()),
                rejected_requests=n_rej, num_chunks=pl.num_chunks,
                race_chunks=pr.num_chunks, block=pl.block,
                vllm_mrv2_bytes=vb, vllm_mrv2_roofline_ms=vb / bw * 1e3,
                bytes_ratio_vs_vllm=nbytes / vb, sample_draft_ms=d_ms))
            print(_line(rows_out[-1]), flush=True)
    return dict(device=_device_name(args.device), copy_bandwidth_gbps=bw / 1e9,
                settings={k: v for k, v in vars(args).items() if k != "out"}, results=rows_out)


def _graph_ms(fn: Callable[[], object], rep: int = 100) -> float:
    """Median milliseconds of ``fn`` replayed as a CUDA graph (device time, no launch cost)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


# vLLM Model Runner V2's rejection sampler on the same H100 and inputs (docs: ANCHORS.md), us
VLLM_MRV2_US = {(64, 3): 108.0, (64, 5): 140.0, (256, 3): 387.0}


def kernel_us(fn: Callable[[], object], reps: int = 20) -> dict[str, float]:
    """Mean device microseconds per call of each kernel ``fn`` launches (torch.profiler over
    ``reps`` eager calls; a kernel's device time does not depend on how it was launched), so a
    sweep shows which of the sampler's passes holds the time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "kernel" in ev.key:
            out[ev.key] = out.get(ev.key, 0.0) + ev.device_time_total / reps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def sweep_candidates() -> list[tuple[str, object, int]]:
    """(label, Tuning, priority): legacy and default first (priority 0), then one knob at a time
    around the default (1: the knobs most likely to matter at B >= 64, 2: the rest)."""
    from dataclasses import replace

    from specserve.kernels import triton_sampling as TS

    d = TS.DEFAULT
    out = [("legacy", TS.LEGACY, 0), ("default", d, 0), ("narrow", TS.NARROW, 0)]
    out += [("no_plain_row_race", replace(d, plain_row_race=False), 1)]
    out += [("no_pdl", replace(d, pdl=False), 1), ("narrow+pdl", replace(TS.NARROW, pdl=True), 2)]
    out += [("prefetch", replace(d, prefetch=True), 1),
            ("prefetch+unroll=2", replace(d, prefetch=True, unroll=2), 1),
            ("narrow+prefetch", replace(TS.NARROW, prefetch=True), 2)]
    out += [("fused", replace(d, fused_race=True), 1),
            ("fused+prefetch", TS.WIDE_FUSED, 1)]
    # around the engine's choice from 256 rows (WIDE_FUSED): the race phase's shape
    wf = TS.WIDE_FUSED
    out += [("wf+whole_steps", replace(wf, race_whole_steps=True), 2),
            ("wf+recover_unroll=2", replace(wf, recover_unroll=2), 2),
            ("wf+ru2+whole_steps", replace(wf, recover_unroll=2, race_whole_steps=True), 2),
            ("wf+race_waves=4", replace(wf, race_waves=4), 2),
            ("wf+race_waves=16", replace(wf, race_waves=16), 2),
            ("wf+row_waves=4", replace(wf, row_waves=4), 2),
            ("wf+early_loads", replace(wf, race_early_loads=True), 2),
            ("wf+early+whole_steps", replace(wf, race_early_loads=True, race_whole_steps=True), 2)]
    out += [(f"unroll={u}", replace(d, unroll=u), 1) for u in (1, 2, 8)]
    out += [(f"row_waves={w}", replace(d, row_waves=w), 1) for w in (2, 4, 16)]
    out += [(f"race_waves={w}", replace(d, race_waves=w), 1) for w in (2, 4, 16)]
    out += [(f"recover_unroll={u}", replace(d, recover_unroll=u), 1) for u in (1, 2, 8)]
    out += [("row_warps=8", replace(d, row_warps=8), 2), ("race_warps=8", replace(d, race_warps=8), 2),
            ("block=2048", replace(d, block=2048), 2), ("block=512", replace(d, block=512), 2),
            ("unsplit", replace(d, split=False), 2), ("serial_accept", replace(d, parallel_accept=False), 2),
            ("legacy+unroll=4", replace(TS.LEGACY, unroll=4), 2)]
    seen, uniq = set(), []
    for label, tuning, prio in out:
        if tuning not in seen:
            seen.add(tuning)
            uniq.append((label, tuning, prio))
    return uniq


def _sweep_time(args, x: dict, tuning) -> float:
    """Device milliseconds of one rejection_sample call with ``tuning`` (CPU: wall time)."""
    from specserve.kernels import triton_sampling as TS

    k = x["k"]
    if args.device == "cuda":
        cu_dev = x.setdefault("cu_dev", x["cu"].to(args.device))
        return _graph_ms(lambda: TS.rejection_sample(  # noqa: E731
            x["target"], cu_dev, x["drafts"], x["q"], *x["params"], x["seeds"], x["positions"],
            args.method, k, tuning=tuning), rep=5)
    return _timer("cpu")(lambda: TS.rejection_sample(  # noqa: E731
        x["target"], x["cu"], x["drafts"], x["q"], *x["params"], x["seeds"], x["positions"],
        args.method, k, tuning=tuning))


def sweep(args: argparse.Namespace) -> dict:
    """Time the candidate plans per (B, k) (see the module docstring); the legacy and default
    rows of every cell first, then variations while the budget lasts, B >= 64 first."""
    import torch

    from specserve.kernels import triton_sampling as TS

    t0 = time.perf_counter()
    timer = _timer(args.device)
    bw = copy_bandwidth(args.device, timer)
    elt = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    dev = torch.device(args.device)
    cells = [(b, k) for b in args.batch_sizes for k in args.ks]
    inputs: dict = {}
    rows: list[dict] = []
    cands = sweep_candidates()
    if args.only:
        only = args.only.split(",")
        unknown = set(only) - {label for label, _, _ in cands}
        if unknown:
            raise SystemExit(f"--only: no candidate named {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(label for label, _, _ in cands)}")
        cands = [(label, tu, 0) for label, tu, _ in cands if label in only]
    order = [(0, c) for c in cells] + [(p, c) for p in (1, 2)
                                       for c in sorted(cells, key=lambda c: (c[0] < 64, c))]
    for prio, (b, k) in order:
        todo = [(lab, tu) for lab, tu, pr in cands if pr == prio]
        for label, tuning in todo:
            if prio > 0 and time.perf_counter() - t0 > args.budget_s:
                break
            if (b, k) not in inputs:
                x = make_inputs(b, k, args)
                out = TS.rejection_sample(x["target"], x["cu"], x["drafts"], x["q"], *x["params"],
                                          x["seeds"], x["positions"], args.method)
                x["n_rej"] = int(((out >= 0).sum(1) <= k).sum())
                x["k"] = k
                x["want"] = out
                inputs[(b, k)] = x
            x = inputs[(b, k)]
            try:
                ms = _sweep_time(args, x, tuning)
            except Exception as exc:     # a candidate that does not build: the others go on
                print(f"B={b:>4} k={k} {label:<22} failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
                continue
            got = TS.rejection_sample(x["target"], x["cu"], x["drafts"], x["q"], *x["params"],
                                      x["seeds"], x["positions"], args.method, tuning=tuning)
            pl = TS.plan(args.vocab, b * (k + 1), dev, tuning=tuning)
            pr = TS.race_plan(args.vocab, b, dev, tuning=tuning)
            nbytes, _ = count_bytes(b, k, args.vocab, elt, x["n_rej"], pl.num_chunks,
                                    pr.num_chunks, args.method, x["q"] is not None, pr.block,
                                    plain_in_row_pass=tuning.races_in_row_pass(k))
            kernels = None
            if args.device == "cuda" and prio == 0:      # where the time goes, per pass
                kernels = kernel_us(lambda: TS.rejection_sample(  # noqa: E731
                    x["target"], x["cu_dev"], x["drafts"], x["q"], *x["params"], x["seeds"],
                    x["positions"], args.method, k, tuning=tuning))
            rows.append(dict(B=b, k=k, label=label, tuning=dataclasses.asdict(tuning),
                             device_ms=ms, frac_copy_bw=nbytes / (ms * 1e-3) / bw, bytes=nbytes,
                             row_chunks=pl.num_chunks, race_chunks=pr.num_chunks,
                             same_tokens=bool(torch.equal(got, x["want"])), kernels_us=kernels))
            split = "" if kernels is None else "  " + ", ".join(
                f"{name.replace('_kernel', '')} {us:.1f}" for name, us in kernels.items())
            print(f"B={b:>4} k={k} {label:<22} {ms * 1e3:9.1f} us  "
                  f"{100 * rows[-1]['frac_copy_bw']:5.1f}% of copy  chunks {pl.num_chunks}/"
                  f"{pr.num_chunks}  same tokens {rows[-1]['same_tokens']}{split}", flush=True)
    drafts = []
    drafting = [k for k in args.ks if k > 0]
    for b in args.batch_sizes if drafting else []:   # the draft sampler's row pass shares the tiling knobs
        x = inputs[(b, drafting[0])]
        for label, tuning in (("legacy", TS.LEGACY), ("default", TS.DEFAULT),
                              ("legacy+pdl", dataclasses.replace(TS.LEGACY, pdl=True))):
            fn = lambda: TS.sample_draft(x["draft_logits"][:b], *x["params"], x["seeds"],  # noqa: E731
                                         x["positions"], True, tuning=tuning)
            ms = _graph_ms(fn, rep=5) if args.device == "cuda" else timer(fn)
            drafts.append(dict(B=b, label=label, device_ms=ms))
            print(f"sample_draft B={b:>4} {label:<10} {ms * 1e3:9.1f} us", flush=True)
    return dict(device=_device_name(args.device), copy_bandwidth_gbps=bw / 1e9, sweep=True,
                settings={k: v for k, v in vars(args).items() if k != "out"},
                elapsed_s=time.perf_counter() - t0, results=rows, sample_draft=drafts,
                best=_best(rows))


def _best(rows: list[dict]) -> list[dict]:
    """Per (B, k): the legacy, default and fastest rows (and vLLM MRv2's figure where known)."""
    out = []
    for b, k in dict.fromkeys((r["B"], r["k"]) for r in rows):
        cell = [r for r in rows if (r["B"], r["k"]) == (b, k) and r["same_tokens"]]
        pick = lambda lab: next((r for r in cell if r["label"] == lab), None)  # noqa: E731
        best = min(cell, key=lambda r: r["device_ms"]) if cell else None
        out.append(dict(B=b, k=k, legacy=pick("legacy"), default=pick("default"), best=best,
                        tried=len(cell), vllm_mrv2_us=VLLM_MRV2_US.get((b, k))))
    return out


def sweep_markdown(res: dict) -> str:
    us = lambda r: "–" if r is None else f"{r['device_ms'] * 1e3:.1f}"  # noqa: E731
    pct = lambda r: "–" if r is None else f"{100 * r['frac_copy_bw']:.0f}"  # noqa: E731
    head = (f"# Rejection sampler plan sweep on {res['device']}\n\nCopy bandwidth "
            f"{res['copy_bandwidth_gbps']:.0f} GB/s; {res['elapsed_s']:.0f} s. Settings: "
            f"`{json.dumps(res['settings'])}`\n\n"
            "| B | k | legacy us | legacy % BW | default us | default % BW | best | best us |"
            " best % BW | vLLM MRv2 us | tried |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {c['B']} | {c['k']} | {us(c['legacy'])} | {pct(c['legacy'])} | {us(c['default'])} | "
             f"{pct(c['default'])} | {c['best']['label'] if c['best'] else '–'} | {us(c['best'])} | "
             f"{pct(c['best'])} | {c['vllm_mrv2_us'] or '–'} | {c['tried']} |" for c in res["best"]]
    allrows = ["\n## Every timing\n\n| B | k | plan | us | % BW | chunks (row/race) | same tokens |",
               "|---|---|---|---|---|---|---|"]
    allrows += [f"| {r['B']} | {r['k']} | {r['label']} | {r['device_ms'] * 1e3:.1f} | "
                f"{100 * r['frac_copy_bw']:.0f} | {r['row_chunks']}/{r['race_chunks']} | "
                f"{r['same_tokens']} |" for r in res["results"]]
    per_kernel = [f"| {r['B']} | {r['k']} | {r['label']} | " + ", ".join(
        f"{n} {us:.1f}" for n, us in r["kernels_us"].items()) + " |"
        for r in res["results"] if r.get("kernels_us")]
    if per_kernel:              # the GPU only
        allrows += ["\n## Device time per kernel (us per call, torch.profiler, eager calls)\n",
                    "| B | k | plan | kernels |", "|---|---|---|---|"] + per_kernel
    drafts = ["\n## sample_draft (store_probs)\n\n| B | plan | us |", "|---|---|---|"]
    drafts += [f"| {r['B']} | {r['label']} | {r['device_ms'] * 1e3:.1f} |" for r in res["sample_draft"]]
    return head + "\n".join(lines) + "\n" + "\n".join(allrows) + "\n" + "\n".join(drafts) + "\n"


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"


def _line(r: dict) -> str:
    dev = f" (device {r['device_ms']:.4f} ms)" if r.get("device_ms") is not None else ""
    return (f"B={r['B']:>4} k={r['k']} {r['median_ms']:.4f} ms{dev}  {r['gbps']:.0f} GB/s "
            f"({100 * r['frac_copy_bw']:.0f}% of copy)  bytes {r['bytes'] / 1e6:.1f} MB vs vLLM "
            f"MRv2 {r['vllm_mrv2_bytes'] / 1e6:.1f} MB  accepted {r['mean_accepted']:.2f}")


def markdown(res: dict) -> str:
    head = (f"# Rejection sampler on {res['device']}\n\nCopy bandwidth {res['copy_bandwidth_gbps']:.0f}"
            f" GB/s. Settings: `{json.dumps(res['settings'])}`\n\n"
            "| B | k | call ms | device ms | MB moved | GB/s | % copy BW | roofline ms | vLLM MRv2 MB |"
            " vLLM MRv2 roofline ms | our/vLLM bytes | mean accepted | sample_draft ms |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    dev = lambda r: "–" if r.get("device_ms") is None else f"{r['device_ms']:.4f}"  # noqa: E731
    rows = [f"| {r['B']} | {r['k']} | {r['median_ms']:.4f} | {dev(r)} | {r['bytes'] / 1e6:.1f} | "
            f"{r['gbps']:.0f} | {100 * r['frac_copy_bw']:.0f} | {r['roofline_ms']:.4f} | "
            f"{r['vllm_mrv2_bytes'] / 1e6:.1f} | {r['vllm_mrv2_roofline_ms']:.4f} | "
            f"{r['bytes_ratio_vs_vllm']:.2f} | {r['mean_accepted']:.2f} | "
            f"{'–' if r['sample_draft_ms'] is None else format(r['sample_draft_ms'], '.4f')} |"
            for r in res["results"]]
    return head + "\n".join(rows) + "\n"


def main() -> None:
    args = _parse()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"        # before any Triton kernel module import
    res = sweep(args) if args.sweep else run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = str(out.with_suffix("") if out.suffix in (".json", ".md") else out)
    Path(stem + ".json").write_text(json.dumps(res, indent=2))
    Path(stem + ".md").write_text(sweep_markdown(res) if args.sweep else markdown(res))
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
