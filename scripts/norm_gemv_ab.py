"""The add + RMSNorm prologue of the GEMV, timed against the two kernels it replaces.

Usage (GPU): python scripts/norm_gemv_ab.py [--out FILE.md]
             python scripts/norm_gemv_ab.py --sweep 6144,1024 [--out FILE.md]

For the projections that follow a layer's norms (qkv and gate_up of the Qwen3-8B and Qwen3-0.6B
shapes) at 1, 2, 4 and 8 rows, bf16: one CUDA graph of ``--calls`` fused launches
(``triton_gemv.add_rms_norm_linear``) against one of the same number of add_rms_norm + linear
pairs (the Triton norm kernel, then the GEMV). Prints microseconds per call, the weight's
bandwidth, and the largest difference of the outputs relative to their scale.

``--sweep N,K``: one row, that projection only; the two kernels at this GPU's table entry
against the fused launch at every launch shape of a grid (block_n 4-32, block_k 256-1024,
warps 4 / 8, stages 3 / 4, one slice of K), fastest first: the fused launch's own launch
shape, which need not be the plain GEMV's (each of its programs normalises the whole row).
"""

from __future__ import annotations

import argparse

import torch

from specserve.bench.report import StreamedTable
from specserve.bench.timing import graph_us_per_call
from specserve.kernels import triton_gemv, triton_layers

SHAPES = {"8b qkv": (6144, 4096), "8b gate_up": (24576, 4096), "llama-8b gate_up": (28672, 4096),
          "0.6b qkv": (4096, 1024), "0.6b gate_up": (6144, 1024)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write the Markdown table here too")
    p.add_argument("--calls", type=int, default=36, help="launches per captured graph")
    p.add_argument("--replays", type=int, default=50, help="timed replays")
    p.add_argument("--sweep", default=None, metavar="N,K",
                   help="sweep the fused launch's shape for this projection at one row")
    a = p.parse_args()
    if a.sweep:
        return _sweep(*(int(v) for v in a.sweep.split(",")), a)
    head = ["shape", "rows", "norm + linear us", "fused us", "fused / two", "fused GB/s", "max rel diff"]
    table = StreamedTable(head)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        g = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16)
        for m in (1, 2, 4, 8):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            res = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)

            def two():
                normed, _ = triton_layers.add_rms_norm(x, res, g, 1e-6)
                return triton_gemv.linear(normed, w)

            def fused():
                # this GPU's config for the fused launch, the kernel even where the table
                # sends the shape to cuBLAS
                cfg = (triton_gemv._norm_config(m, n, k, w.device)
                       or triton_gemv._default_config(m, n, k))
                return triton_gemv.add_rms_norm_linear(x, res, g, 1e-6, w, config=cfg)[0]

            want, got = two().float(), fused().float()
            rel = ((got - want).abs().max() / want.abs().max()).item()
            t_two = graph_us_per_call(two, a.calls, a.replays)
            t_fused = graph_us_per_call(fused, a.calls, a.replays)
            row = [name, str(m), f"{t_two:.2f}", f"{t_fused:.2f}", f"{t_fused / t_two:.3f}",
                   f"{w.numel() * 2 / t_fused / 1e3:.0f}", f"{rel:.1e}"]
            table.add(row)
    table.finish(a.out)


def _sweep(n: int, k: int, a) -> None:
    import itertools

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    g = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16)
    x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    res = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)

    def two():
        normed, _ = triton_layers.add_rms_norm(x, res, g, 1e-6)
        return triton_gemv.linear(normed, w)

    want = two().float()
    t_two = graph_us_per_call(two, a.calls, a.replays)
    rows = []
    for bn, bk, warps, stages in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8), (3, 4)):
        if bk > k:
            continue
        cfg = triton_gemv.GemvConfig(bn, bk, 1, warps, stages, "late")

        def fused(cfg=cfg):
            return triton_gemv.add_rms_norm_linear(x, res, g, 1e-6, w, config=cfg)[0]

        got = fused()
        if got is None:
            continue
        rel = ((got.float() - want).abs().max() / want.abs().max()).item()
        rows.append((graph_us_per_call(fused, a.calls, a.replays), cfg.label, rel))
    rows.sort()
    table = StreamedTable(["launch shape", "fused us", "fused / two", "max rel diff"])
    table.add(["(two kernels, this GPU's table)", f"{t_two:.2f}", "1.000", "0"])
    for t, label, rel in rows:
        table.add([label, f"{t:.2f}", f"{t / t_two:.3f}", f"{rel:.1e}"])
    table.finish(a.out)


if __name__ == "__main__":
    main()
