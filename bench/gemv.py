"""The GEMV kernel (kernels/triton_gemv.py) against cuBLAS at decode batch sizes.

    python -m specserve.bench.gemv --out DIR                 # H100: about a minute and a half
    python -m specserve.bench.gemv --out DIR --grid wide     # more candidate configs (slower)
    python -m specserve.bench.gemv --out DIR --device cpu    # interpreter smoke run, toy shapes

For every linear layer of Qwen3-8B, Llama-3-8B and Qwen3-0.6B (qkv, o, gate_up, down, lm_head;
shapes from bench/shapes.py) and M = 1, 2, 4, 8 rows of bf16 activations, it times
``torch.nn.functional.linear`` (cuBLAS) and each candidate :class:`GemvConfig` of our kernel.

Timing: one CUDA graph of many back-to-back calls, replayed; the time per call is a replay's
CUDA-event time divided by the calls in it, so each kernel's launch inside a graph is part of the
number, as in the engine's decode graphs. The weights are not served from L2 (50 MB on an H100):
the calls rotate over enough separate copies of the weight to make >= 256 MiB (one copy when a
weight alone is that big), so each call reads its weight from HBM, as a decode step does.

Reported per (shape, M): microseconds, GB/s over the bytes a call must move (weight + x + output),
that as % of a device-to-device copy bandwidth measured in the same run (bench.timing), the
speedup over cuBLAS, and the error of both against an fp32 product of the same bf16 inputs (a
config whose error exceeds twice cuBLAS's, or 1/128 of the output's scale, is marked and never
picked). Writes DIR/gemv.json and DIR/gemv.md, the latter ending with a ``CONFIG_TABLE`` to paste
into kernels/triton_gemv.py (the best config per (M, N, K); None where cuBLAS was faster).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

ROTATE_BYTES = 256 << 20     # weight copies per timed graph cover at least this much memory
MIN_CALLS = 32               # calls per graph (more when there are more copies)
REPLAYS = 7


@dataclass(frozen=True)
class Layer:
    model: str
    name: str
    n: int
    k: int


def model_layers(shape) -> list[Layer]:
    """The five linears of a decoder (bench.shapes.ModelShape): qkv, o, gate_up, down, lm_head."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    h, i = shape.hidden_size, shape.intermediate_size
    return [Layer(shape.name, "qkv", q + 2 * kv, h), Layer(shape.name, "o", h, q),
            Layer(shape.name, "gate_up", 2 * i, h), Layer(shape.name, "down", h, i),
            Layer(shape.name, "lm_head", shape.vocab_size, h)]


def candidates(m: int, n: int, k: int, grid: str) -> list:
    """Configs to time for one cell: the kernel's own choice first, then a grid around it."""
    from specserve.kernels.triton_gemv import GemvConfig, gemv_config

    if grid == "cpu":                      # interpreter smoke run: the kernel's own choice only
        return [c for c in [gemv_config(m, n, k)] if c is not None]
    import torch

    out = [gemv_config(m, n, k, torch.device("cuda"))]   # this GPU's table
    wide = grid == "wide"
    stages = (3, 4) if wide else (3,)
    if m <= (4 if wide else 2):            # CUDA cores: one row, and a few more if --grid wide
        bm = 1 << (m - 1).bit_length()
        for bn in ((4, 8, 16) if wide else (4, 8)):
            for bk in ((256, 512) if wide else (512,)):
                for mode in (("late", "step") if wide and m > 1 else ("late",)):
                    if mode == "late" and bm * bn * bk > 128 * 32 * 4:   # > 128 acc registers
                        continue
                    for s in stages:
                        out += [GemvConfig(bn, bk, sp, 4, s, mode) for sp in _splits(n, k, bn, bk, wide)]
    if m > 1:                              # tensor cores
        for bn in ((16, 32, 64, 128) if wide else (32, 64)):
            for bk in ((64, 128, 256) if wide else (128,)):
                for s in ((3, 4) if wide else (4,)):
                    for warps in (4,):
                        out += [GemvConfig(bn, bk, sp, warps, s, "dot")
                                for sp in _splits(n, k, bn, bk, wide)]
    seen: set = set()
    return [c for c in out if c is not None and _fits(c) and not (c in seen or seen.add(c))]


def _fits(cfg) -> bool:
    """The pipelined tiles (weight + x, bf16) fit in an H100's 227 KiB of shared memory."""
    return cfg.num_stages * (cfg.block_n + 16) * cfg.block_k * 2 <= 200 * 1024


def _splits(n: int, k: int, bn: int, bk: int, wide: bool) -> list[int]:
    """1, and the split that brings the grid to at least one program per SM of an H100 (and x2
    of it for --grid wide), when K has the tiles for it."""
    out, blocks, s = [1], -(-n // bn), 1
    while blocks * s < 132 and k // (2 * s) >= 2 * bk:
        s *= 2
    if s > 1:
        out.append(s)
        if wide and k // (2 * s) >= 2 * bk:
            out.append(2 * s)
    return out


def _graph_us(calls: list[Callable[[], object]], device) -> float:
    """Median microseconds per call of ``calls`` captured back to back in one CUDA graph."""
    import torch

    from specserve.bench.timing import median

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):            # warm up off the default stream (as capture wants)
        for c in calls[:2]:
            c()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return median(times)


def _cpu_us(calls: list[Callable[[], object]], device) -> float:
    from specserve.bench.timing import median, time_calls

    return median(time_calls(calls[0], device, warmup=1, repeats=3)) * 1e6


def measure_cell(layer: Layer, m: int, cfgs: list, device, dtype, timer) -> dict:
    """cuBLAS and every config in ``cfgs`` at one (layer, M): times, errors, bytes."""
    import torch
    import torch.nn.functional as F

    from specserve.kernels import triton_gemv

    n, k = layer.n, layer.k
    elt = torch.empty(0, dtype=dtype).element_size()
    w_bytes = n * k * elt
    copies = max(1, math.ceil(ROTATE_BYTES / w_bytes)) if device.type == "cuda" else 1
    gen = torch.Generator(device=device).manual_seed(n * 31 + k)
    ws = [(torch.randn(n, k, device=device, generator=gen) / math.sqrt(k)).to(dtype)
          for _ in range(copies)]                                                  # copies x [N, K]
    x = torch.randn(m, k, device=device, generator=gen).to(dtype)                 # [M, K]
    n_calls = copies * max(1, -(-MIN_CALLS // copies)) if device.type == "cuda" else 1
    exact = (x.float() @ ws[0].float().T)                                          # [M, N] fp32
    scale = float(exact.abs().max())
    ref = F.linear(x, ws[0])
    ref_err = float((ref.float() - exact).abs().max())
    nbytes = w_bytes + (m * k + m * n) * elt
    cublas_us = timer([lambda i=i: F.linear(x, ws[i % copies]) for i in range(n_calls)], device)
    rows = []
    for cfg in cfgs:
        try:
            got = triton_gemv.linear(x, ws[0], config=cfg)
            err = float((got.float() - exact).abs().max())
            us = timer([lambda i=i: triton_gemv.linear(x, ws[i % copies], config=cfg)
                        for i in range(n_calls)], device)
        except Exception as e:  # noqa: BLE001 - a config that cannot launch is reported, not fatal
            print(f"  {cfg.label}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            rows.append(dict(config=asdict(cfg), label=cfg.label, us=None, ok=False,
                             max_err=math.nan, speedup=0.0, error=f"{type(e).__name__}: {e}"[:300]))
            continue
        ok = err <= max(2 * ref_err, scale / 128)
        rows.append(dict(config=asdict(cfg), label=cfg.label, us=us, ok=ok, max_err=err,
                         speedup=cublas_us / us))
    del ws
    return dict(model=layer.model, layer=layer.name, M=m, N=n, K=k, bytes=nbytes,
                weight_copies=copies, calls_per_graph=n_calls, cublas_us=cublas_us,
                cublas_max_err=ref_err, out_scale=scale, configs=rows)


def _summarise(cell: dict, copy_bw: float) -> dict:
    """The default config's row, the best correct row, and their bandwidth figures."""
    good = [r for r in cell["configs"] if r["ok"]]
    best = min(good, key=lambda r: r["us"]) if good else None
    default = cell["configs"][0]
    bw = lambda us: cell["bytes"] / (us * 1e-6)  # noqa: E731
    cell.update(
        cublas_gbps=bw(cell["cublas_us"]) / 1e9, cublas_pct_copy=100 * bw(cell["cublas_us"]) / copy_bw,
        default_label=default["label"], default_us=default["us"] or math.nan,
        default_ok=default["ok"],
        best_label=best["label"] if best else None, best_config=best["config"] if best else None,
        best_us=best["us"] if best else None,
        best_gbps=bw(best["us"]) / 1e9 if best else None,
        best_pct_copy=100 * bw(best["us"]) / copy_bw if best else None,
        best_speedup=best["speedup"] if best else None,
        roofline_us=cell["bytes"] / copy_bw * 1e6)
    return cell


def run(args: argparse.Namespace) -> dict:
    import torch

    from specserve.bench import shapes
    from specserve.bench.timing import copy_bandwidth, environment

    t0 = time.perf_counter()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    models = ([shapes.QWEN3_8B_LIKE, shapes.LLAMA3_8B_LIKE, shapes.QWEN3_06B_LIKE] if cuda
              else [shapes.TINY_DRAFT])
    if args.models:
        models = [s for s in models if s.name in args.models.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    grid = args.grid if cuda else "cpu"
    bw = copy_bandwidth(device, (1 << 30) if cuda else (1 << 24))
    print(f"copy bandwidth {bw.bytes_per_s / 1e9:.0f} GB/s ({bw.method})", flush=True)
    timer = _graph_us if cuda else _cpu_us
    dtype = torch.bfloat16 if cuda else torch.float32      # the interpreter cannot do bf16
    measured: dict[tuple[int, int, int], dict] = {}
    cells = []
    for shape in models:
        for layer in model_layers(shape):
            for m in ms:
                key = (m, layer.n, layer.k)
                if key not in measured:      # Qwen3-8B and Llama-3-8B share qkv and o
                    cfgs = candidates(m, layer.n, layer.k, grid)
                    measured[key] = _summarise(measure_cell(layer, m, cfgs, device, dtype, timer),
                                               bw.bytes_per_s)
                cell = dict(measured[key], model=layer.model, layer=layer.name)
                cells.append(cell)
                print(_line(cell, time.perf_counter() - t0), flush=True)
    return dict(env=environment(device, " ".join(["python -m specserve.bench.gemv"] + sys.argv[1:])),
                copy_bandwidth=bw.as_dict(), dtype=str(dtype).replace("torch.", ""),
                rotate_bytes=ROTATE_BYTES, grid=args.grid, elapsed_s=time.perf_counter() - t0,
                cells=cells)


def _line(c: dict, t: float) -> str:
    best = (f"best {c['best_label']} {c['best_us']:.1f} us ({c['best_pct_copy']:.0f}% copy BW, "
            f"{c['best_speedup']:.2f}x)") if c["best_label"] else "no correct config"
    return (f"[{t:5.0f} s] {c['model']:<16} {c['layer']:<8} M={c['M']} N={c['N']:>6} K={c['K']:>5}  "
            f"cuBLAS {c['cublas_us']:8.1f} us ({c['cublas_pct_copy']:3.0f}%)  default "
            f"{c['default_us']:8.1f} us  {best}  [{len(c['configs'])} configs]")


def config_table(cells: list[dict]) -> str:
    """Python source of CONFIG_TABLE: (M, N, K) -> best config, or None where cuBLAS won."""
    from specserve.kernels.triton_gemv import table_from_cells

    table = table_from_cells(cells)       # what the kernel module makes of this run's cells
    lines = ["CONFIG_TABLE: dict[tuple[int, int, int], Optional[GemvConfig]] = {"]
    seen = set()
    for c in sorted(cells, key=lambda c: (c["N"], c["K"], c["M"])):
        key = (1 << (c["M"] - 1).bit_length(), c["N"], c["K"])    # the table's row buckets
        if key in seen:
            continue
        seen.add(key)
        b = table[key]
        val = "None" if b is None else (f"GemvConfig({b.block_n}, {b.block_k}, {b.split_k}, "
                                        f"{b.num_warps}, {b.num_stages}, \"{b.mode}\")")
        speed = f"{c['best_speedup']:.2f}x" if c["best_speedup"] else "-"
        lines.append(f"    {key}: {val},  # {c['model']} {c['layer']}, {speed} vs cuBLAS")
    return "\n".join(lines + ["}"])


def markdown(res: dict) -> str:
    env, bw = res["env"], res["copy_bandwidth"]["bytes_per_s"]
    f = lambda v, p=1: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    head = [f"# GEMV (kernels/triton_gemv.py) vs cuBLAS on {env['device']}", "",
            f"{env['date']}; torch {env['torch']}, triton {env['triton']}, {res['dtype']}; "
            f"copy bandwidth {bw / 1e9:.0f} GB/s; {res['elapsed_s']:.0f} s; `{env['command']}`.", "",
            "Each time is per call, from one CUDA graph of back-to-back calls (launches included) "
            f"rotating over weight copies totalling >= {res['rotate_bytes'] >> 20} MiB (weights "
            "read from HBM, not L2). GB/s and % copy count weight + x + output bytes. "
            "`default` is gemv_config's choice; `best` the fastest config whose error is within "
            "bounds.", "",
            "| model | layer | M | N | K | roofline us | cuBLAS us | cuBLAS % copy | default us | "
            "best | best us | best GB/s | best % copy | speedup |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [f"| {c['model']} | {c['layer']} | {c['M']} | {c['N']} | {c['K']} | "
            f"{c['roofline_us']:.1f} | {c['cublas_us']:.1f} | {c['cublas_pct_copy']:.0f} | "
            f"{c['default_us']:.1f}{'' if c['default_ok'] else ' (wrong)'} | {c['best_label'] or '–'} | "
            f"{f(c['best_us'])} | {f(c['best_gbps'], 0)} | {f(c['best_pct_copy'], 0)} | "
            f"{f(c['best_speedup'], 2)}x |" for c in res["cells"]]
    bad = [f"{c['model']} {c['layer']} M={c['M']} {r['label']} "
           f"({r.get('error') or 'err %.3g' % r['max_err']})"
           for c in res["cells"] for r in c["configs"] if not r["ok"]]
    tail = ["", f"Configs outside the error bound: {', '.join(bad) if bad else 'none'}.", "",
            "## Ready-to-paste table (kernels/triton_gemv.py)", "", "```python",
            config_table(res["cells"]), "```", ""]
    return "\n".join(head + rows + tail)


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (gemv.json, gemv.md)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ms", default="1,2,4,8", help="comma list of row counts")
    ap.add_argument("--models", default=None,
                    help="comma list of model names to keep (default: all three; cpu: tiny-draft)")
    ap.add_argument("--grid", default="narrow", choices=["narrow", "wide"],
                    help="candidate configs per cell (wide: ~10x more, several minutes)")
    return ap.parse_args()


def main() -> None:
    args = _parse()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"        # before any Triton kernel module import
    res = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemv.json").write_text(json.dumps(res, indent=2))
    (out / "gemv.md").write_text(markdown(res))
    print(f"wrote {out / 'gemv.json'} and {out / 'gemv.md'} ({res['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
