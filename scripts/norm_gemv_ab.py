"""The add + RMSNorm prologue of the GEMV, timed against the two kernels it replaces.

Usage (GPU): python scripts/norm_gemv_ab.py [--out FILE.md]

For the projections that follow a layer's norms (qkv and gate_up of the Qwen3-8B and Qwen3-0.6B
shapes) at 1, 2, 4 and 8 rows, bf16: one CUDA graph of ``--calls`` fused launches
(``triton_gemv.add_rms_norm_linear``) against one of the same number of add_rms_norm + linear
pairs (the Triton norm kernel, then the GEMV). Prints microseconds per call, the weight's
bandwidth, and the largest difference of the outputs relative to their scale.
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
    a = p.parse_args()
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
                # this GPU's config, the kernel even where the table sends the shape to cuBLAS
                cfg = (triton_gemv.gemv_config(m, n, k, w.device)
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


if __name__ == "__main__":
    main()
