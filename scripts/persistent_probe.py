"""Probe (GPU): what a grid barrier costs in a Triton persistent kernel, and how close a chain of
barrier-separated GEMV stages over the 0.6B draft's layer weights gets to the copy roofline,
against the same chain launched kernel by kernel (this repo's GEMV and cuBLAS) in a CUDA graph.

It answers one question before building a persistent draft forward: is a software grid barrier
cheap enough that ~5 of them per layer beat ~9 kernel boundaries per layer?

    python scripts/persistent_probe.py --out /tmp/probe    (GPU only)
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

from specserve.bench.timing import capture_graph


@triton.jit
def _spin_load(ptr, SPIN: tl.constexpr):
    if SPIN == 0:
        v = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    else:
        v = tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr],
                                      dtype=tl.int32, is_pure=False, pack=1)
    return v


@triton.jit
def _grid_sync(bar_ptr, target, SPIN: tl.constexpr):
    """Every program adds one to the counter, then waits until it reaches ``target``."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = _spin_load(bar_ptr, SPIN)
    spins = 0
    while (seen < target) & (spins < 1 << 20):   # bounded: a probe must not hang the device
        seen = _spin_load(bar_ptr, SPIN)
        spins += 1
    tl.debug_barrier()


@triton.jit
def _barriers_kernel(bar_ptr, n_barriers, SPIN: tl.constexpr):
    nprog = tl.num_programs(0)
    i = 0
    while i < n_barriers:
        i += 1
        _grid_sync(bar_ptr, i * nprog, SPIN)


@triton.jit
def _gemv_tiles(x_ptr, w_ptr, out_ptr, res_ptr, N, pid, nprog, K: tl.constexpr, BN: tl.constexpr,
                SILU: tl.constexpr, RESID: tl.constexpr):
    """out[n] = sum_k w[n, k] x[k] for this program's tiles of BN outputs (whole K per tile).
    SILU: w holds gate rows then up rows (N each); out[n] = silu(gate) * up. RESID: out += res.
    (N is a multiple of BN in every shape the probe runs: rows are not masked.)"""
    KP: tl.constexpr = triton.next_power_of_2(K)
    kk = tl.arange(0, KP)
    kmask = kk < K
    x = tl.load(x_ptr + kk, mask=kmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    t = pid
    while t < tl.cdiv(N, BN):   # (a while loop: the CPU interpreter cannot range over a runtime int)
        n = t * BN + tl.arange(0, BN)
        w = tl.load(w_ptr + n[:, None] * K + kk[None, :], mask=kmask[None, :], other=0.0)
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if SILU:
            wu = tl.load(w_ptr + (N + n)[:, None] * K + kk[None, :], mask=kmask[None, :], other=0.0)
            up = tl.sum(wu.to(tl.float32) * x[None, :], axis=1)
            g = acc.to(tl.bfloat16).to(tl.float32)
            acc = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * up.to(tl.bfloat16).to(tl.float32)
        if RESID:
            acc += tl.load(res_ptr + n, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + n, acc.to(tl.bfloat16))
        t += nprog


@triton.jit
def _l2_prefetch(ptrs):
    """Ask L2 for the 128-byte lines at ``ptrs`` (fire and forget; nothing waits for them)."""
    tl.inline_asm_elementwise("mov.b32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_tiles(w_ptr, N, pid, nprog, K: tl.constexpr, BN: tl.constexpr, PAIR: tl.constexpr):
    """L2 prefetch of the weight rows this program's tiles of a stage will read."""
    LINES: tl.constexpr = triton.next_power_of_2(K // 64)
    t = pid
    while t < tl.cdiv(N, BN):
        rows = t * BN + tl.arange(0, BN)
        offs = rows[:, None] * K + tl.minimum(tl.arange(0, LINES), K // 64 - 1)[None, :] * 64
        _l2_prefetch(w_ptr + offs)
        if PAIR:
            _l2_prefetch(w_ptr + N * K + offs)
        t += nprog


@triton.jit
def _prefetch_kind(kind: tl.constexpr, layer, wqkv, wo, wgu, wd, pid, nprog, H: tl.constexpr,
                   QKV: tl.constexpr, QO: tl.constexpr, I: tl.constexpr, BN_QKV: tl.constexpr,
                   BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr):
    if kind == 0:
        _prefetch_tiles(wqkv + layer * QKV * H, QKV, pid, nprog, H, BN_QKV, False)
    elif kind == 1:
        _prefetch_tiles(wo + layer * H * QO, H, pid, nprog, QO, BN_O, False)
    elif kind == 2:
        _prefetch_tiles(wgu + layer * 2 * I * H, I, pid, nprog, H, BN_GU, True)
    else:
        _prefetch_tiles(wd + layer * H * I, H, pid, nprog, I, BN_D, False)


@triton.jit
def _pf_ahead(s: tl.constexpr, DIST: tl.constexpr, layer, N_LAYERS: tl.constexpr, wqkv, wo, wgu,
              wd, pid, nprog, H: tl.constexpr, QKV: tl.constexpr, QO: tl.constexpr,
              I: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
              BN_D: tl.constexpr):
    """From stage s of ``layer``, prefetch the stage DIST stages ahead (if there is one)."""
    if DIST > 0:
        ahead = layer + (s + DIST) // 4
        if ahead < N_LAYERS:
            _prefetch_kind((s + DIST) % 4, ahead, wqkv, wo, wgu, wd, pid, nprog, H, QKV, QO, I,
                           BN_QKV, BN_O, BN_GU, BN_D)


@triton.jit
def _layers_pf_kernel(h_ptr, qkv_ptr, act_ptr, wqkv, wo, wgu, wd, bar_ptr, N_LAYERS: tl.constexpr,
                      H: tl.constexpr, QKV: tl.constexpr, QO: tl.constexpr, I: tl.constexpr,
                      BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
                      BN_D: tl.constexpr, DIST: tl.constexpr):
    """_layers_kernel with the weights of the stage DIST stages ahead prefetched into L2."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for d in tl.static_range(1, DIST):
        _prefetch_kind(d % 4, d // 4, wqkv, wo, wgu, wd, pid, nprog, H, QKV, QO, I,
                       BN_QKV, BN_O, BN_GU, BN_D)
    b = 0
    for layer in range(N_LAYERS):
        _pf_ahead(0, DIST, layer, N_LAYERS, wqkv, wo, wgu, wd, pid, nprog, H, QKV, QO, I, BN_QKV, BN_O, BN_GU, BN_D)
        _gemv_tiles(h_ptr, wqkv + layer * QKV * H, qkv_ptr, h_ptr, QKV, pid, nprog, H, BN_QKV, False, False)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)
        _pf_ahead(1, DIST, layer, N_LAYERS, wqkv, wo, wgu, wd, pid, nprog, H, QKV, QO, I, BN_QKV, BN_O, BN_GU, BN_D)
        _gemv_tiles(qkv_ptr, wo + layer * H * QO, h_ptr, h_ptr, H, pid, nprog, QO, BN_O, False, True)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)
        _pf_ahead(2, DIST, layer, N_LAYERS, wqkv, wo, wgu, wd, pid, nprog, H, QKV, QO, I, BN_QKV, BN_O, BN_GU, BN_D)
        _gemv_tiles(h_ptr, wgu + layer * 2 * I * H, act_ptr, h_ptr, I, pid, nprog, H, BN_GU, True, False)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)
        _pf_ahead(3, DIST, layer, N_LAYERS, wqkv, wo, wgu, wd, pid, nprog, H, QKV, QO, I, BN_QKV, BN_O, BN_GU, BN_D)
        _gemv_tiles(act_ptr, wd + layer * H * I, h_ptr, h_ptr, H, pid, nprog, I, BN_D, False, True)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)


@triton.jit
def _tile_load(w_ptr, N, pid, K: tl.constexpr, BN: tl.constexpr):
    """This program's [BN, K] weight tile (rows pid * BN ..), zeros past N or K."""
    KP: tl.constexpr = triton.next_power_of_2(K)
    n = pid * BN + tl.arange(0, BN)
    kk = tl.arange(0, KP)
    return tl.load(w_ptr + n[:, None] * K + kk[None, :], mask=(n[:, None] < N) & (kk[None, :] < K),
                   other=0.0)


@triton.jit
def _tile_apply(w, x_ptr, out_ptr, N, pid, K: tl.constexpr, BN: tl.constexpr, RESID: tl.constexpr):
    """out[rows] = w @ x (+ out[rows] when RESID) for the tile loaded by _tile_load."""
    KP: tl.constexpr = triton.next_power_of_2(K)
    kk = tl.arange(0, KP)
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    n = pid * BN + tl.arange(0, BN)
    if RESID:
        acc += tl.load(out_ptr + n, mask=n < N, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + n, acc.to(tl.bfloat16), mask=n < N)


@triton.jit
def _tile_apply_silu(wg, wu, x_ptr, out_ptr, N, pid, K: tl.constexpr, BN: tl.constexpr):
    kk = tl.arange(0, K)
    x = tl.load(x_ptr + kk, cache_modifier=".cg").to(tl.float32)
    g = tl.sum(wg.to(tl.float32) * x[None, :], axis=1).to(tl.bfloat16).to(tl.float32)
    u = tl.sum(wu.to(tl.float32) * x[None, :], axis=1).to(tl.bfloat16).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u
    n = pid * BN + tl.arange(0, BN)
    tl.store(out_ptr + n, act.to(tl.bfloat16), mask=n < N)


@triton.jit
def _layers_pipe_kernel(h_ptr, qkv_ptr, act_ptr, wqkv, wo, wgu, wd, bar_ptr,
                        N_LAYERS: tl.constexpr, H: tl.constexpr, QKV: tl.constexpr,
                        QO: tl.constexpr, I: tl.constexpr, BN_QKV: tl.constexpr,
                        BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr):
    """One tile per program per stage; the next stage's tile is loaded into registers before
    the grid barrier, so the weight stream runs through the barrier."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    w_qkv = _tile_load(wqkv, QKV, pid, H, BN_QKV)
    b = 0
    for layer in range(N_LAYERS):
        w_o = _tile_load(wo + layer * H * QO, H, pid, QO, BN_O)
        _tile_apply(w_qkv, h_ptr, qkv_ptr, QKV, pid, H, BN_QKV, False)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)
        w_g = _tile_load(wgu + layer * 2 * I * H, I, pid, H, BN_GU)
        w_u = _tile_load(wgu + layer * 2 * I * H + I * H, I, pid, H, BN_GU)
        _tile_apply(w_o, qkv_ptr, h_ptr, H, pid, QO, BN_O, True)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)
        w_d = _tile_load(wd + layer * H * I, H, pid, I, BN_D)
        _tile_apply_silu(w_g, w_u, h_ptr, act_ptr, I, pid, H, BN_GU)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)
        nxt = tl.minimum(layer + 1, N_LAYERS - 1)
        w_qkv = _tile_load(wqkv + nxt * QKV * H, QKV, pid, H, BN_QKV)
        _tile_apply(w_d, act_ptr, h_ptr, H, pid, I, BN_D, True)
        b += 1
        _grid_sync(bar_ptr, b * nprog, 0)


@triton.jit
def _layers_kernel(h_ptr, qkv_ptr, act_ptr, wqkv, wo, wgu, wd, bar_ptr, N_LAYERS: tl.constexpr,
                   H: tl.constexpr, QKV: tl.constexpr, QO: tl.constexpr, I: tl.constexpr,
                   BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
                   BN_D: tl.constexpr, SPIN: tl.constexpr, SYNC: tl.constexpr):
    """The draft's four projections per layer, a grid barrier after each (no norm/attention:
    the o projection reads the first QO outputs of qkv in place of attention's output)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    b = 0
    for layer in range(N_LAYERS):
        _gemv_tiles(h_ptr, wqkv + layer * QKV * H, qkv_ptr, h_ptr, QKV, pid, nprog, H, BN_QKV, False, False)
        if SYNC:
            b += 1
            _grid_sync(bar_ptr, b * nprog, SPIN)
        _gemv_tiles(qkv_ptr, wo + layer * H * QO, h_ptr, h_ptr, H, pid, nprog, QO, BN_O, False, True)
        if SYNC:
            b += 1
            _grid_sync(bar_ptr, b * nprog, SPIN)
        _gemv_tiles(h_ptr, wgu + layer * 2 * I * H, act_ptr, h_ptr, I, pid, nprog, H, BN_GU, True, False)
        if SYNC:
            b += 1
            _grid_sync(bar_ptr, b * nprog, SPIN)
        _gemv_tiles(act_ptr, wd + layer * H * I, h_ptr, h_ptr, H, pid, nprog, I, BN_D, False, True)
        if SYNC:
            b += 1
            _grid_sync(bar_ptr, b * nprog, SPIN)


def _time_us(fn, iters=50, warm=5) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def _graph(fn):
    return capture_graph(fn)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/probe")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--sweep", default="pipelined", choices=("plain", "prefetch", "pipelined"),
                    help="plain: barrier-separated stages, two spin loads and no barrier at all; "
                         "prefetch: plus L2 prefetch of the stage 1, 2 or 4 ahead; pipelined: one "
                         "tile per program, the next stage's tile loaded before the barrier")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    results: dict = {"device": torch.cuda.get_device_name(), "sms": sms}
    lines = [f"# persistent probe on {results['device']} ({sms} SMs), {time.strftime('%F %T')}"]
    bar = torch.zeros(1, dtype=torch.int32, device=dev)

    # 1. barrier cost
    for nprog in (sms,):
        for spin in (0,):
            nb = 200
            def run(nprog=nprog, spin=spin, nb=nb):
                bar.zero_()
                _barriers_kernel[(nprog,)](bar, nb, SPIN=spin, num_warps=4)
            try:
                t = _time_us(run, iters=20)
                t0 = _time_us(lambda: (bar.zero_(), _barriers_kernel[(nprog,)](bar, 0, SPIN=spin, num_warps=4)), iters=20)
                per = (t - t0) / nb
            except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                per = None
                lines.append(f"barrier nprog={nprog} spin={spin}: failed {e!r}")
            results[f"barrier_us_nprog{nprog}_spin{spin}"] = per
            lines.append(f"barrier nprog={nprog} spin={'atomic' if spin == 0 else 'ld.acquire'}: "
                         f"{per if per is None else round(per, 3)} us each")

    # 2. the draft's four projections per layer, 28 layers
    H, QKV, QO, I, L = 1024, 4096, 2048, 3072, args.layers
    g = torch.Generator(device=dev).manual_seed(0)
    def rnd(*shape):
        return (torch.randn(*shape, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    wqkv, wo, wgu, wd = rnd(L, QKV, H), rnd(L, H, QO), rnd(L, 2 * I, H), rnd(L, H, I)
    weight_bytes = sum(w.numel() * 2 for w in (wqkv, wo, wgu, wd))
    copy_gbs = _copy_bandwidth(dev)
    roof_us = weight_bytes / (copy_gbs * 1e3)
    results.update(weight_mb=weight_bytes / 1e6, copy_gbs=copy_gbs, roofline_us=roof_us)
    lines.append(f"layers={L}: weights {weight_bytes / 1e6:.0f} MB, copy {copy_gbs:.0f} GB/s, roofline {roof_us:.1f} us")
    h0 = rnd(1, H)
    h, qkv, act = h0.clone(), torch.zeros(1, QKV, device=dev, dtype=torch.bfloat16), torch.zeros(1, I, device=dev, dtype=torch.bfloat16)

    def reference(gemv: bool):
        from specserve.kernels import triton_layers  # noqa: F401 (backend import order)
        from specserve.kernels import triton_gemv
        hh = h0.clone()
        for l in range(L):
            if gemv:
                y = triton_gemv.linear(hh, wqkv[l])
                hh = hh + triton_gemv.linear(y[:, :QO], wo[l])
                gu = triton_gemv.linear(hh, wgu[l])
                hh = hh + triton_gemv.silu_mul_linear(gu, wd[l])
            else:
                y = hh @ wqkv[l].t()
                hh = hh + y[:, :QO] @ wo[l].t()
                gu = hh @ wgu[l].t()
                a = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
                hh = hh + a @ wd[l].t()
        return hh

    want = reference(False)
    for name, gemv in (("cublas chain", False), ("gemv chain", True)):
        try:
            graph = _graph(lambda gemv=gemv: reference(gemv))
            t = _time_us(graph.replay)
            results[f"{name}_us"] = t
            lines.append(f"{name} (CUDA graph, {4 * L} launches + adds): {t:.1f} us = {t / roof_us:.2f}x roofline")
        except Exception as e:  # noqa: BLE001
            lines.append(f"{name}: failed {e!r}")

    def record(key, run):
        try:
            run()
            torch.cuda.synchronize()
            err = (h.float() - want.float()).abs().max().item()
            t = _time_us(run, iters=20)
            results[key] = {"us": t, "x_roofline": t / roof_us, "max_err": err}
            lines.append(f"{key}: {t:.1f} us = {t / roof_us:.2f}x roofline (max err {err:.3g})")
        except Exception as e:  # noqa: BLE001 (a probe: report and go on)
            lines.append(f"{key}: failed {e!r}"[:300])
        print(lines[-1], flush=True)

    args_common = (h, qkv, act, wqkv, wo, wgu, wd, bar, L, H, QKV, QO, I)
    if args.sweep == "plain":
        for nprog in (sms, 2 * sms):
            for spin in (0, 1):
                for bns in ((32, 8, 16, 8), (16, 8, 16, 4), (32, 16, 32, 8)):
                    def run(nprog=nprog, spin=spin, bns=bns):
                        h.copy_(h0)
                        bar.zero_()
                        _layers_kernel[(nprog,)](*args_common, *bns, SPIN=spin, SYNC=True, num_warps=8)
                    record(f"persistent nprog={nprog} spin={spin} bn={bns}", run)
            record(f"no barriers (wrong results: the stages' own speed) nprog={nprog}",
                   lambda nprog=nprog: _layers_kernel[(nprog,)](*args_common, 32, 8, 16, 8, SPIN=0,
                                                                 SYNC=False, num_warps=8))
    if args.sweep == "prefetch":
        for nprog in (sms, 2 * sms):
            for bns in ((16, 8, 16, 4), (32, 16, 32, 8), (8, 4, 8, 4)):
                for dist in (0, 1, 2, 4):
                    def run(nprog=nprog, bns=bns, dist=dist):
                        h.copy_(h0)
                        bar.zero_()
                        _layers_pf_kernel[(nprog,)](*args_common, *bns, DIST=dist, num_warps=8)
                    record(f"persistent nprog={nprog} bn={bns} prefetch={dist} warps=8", run)
    pipelined = (((2 * sms, (16, 4, 16, 4), 8), (2 * sms, (16, 4, 16, 4), 4),
                  (sms, (32, 8, 32, 8), 8), (sms, (32, 8, 32, 8), 16),
                  (4 * sms, (8, 2, 8, 2), 4), (3 * sms, (16, 4, 8, 4), 4))
                 if args.sweep == "pipelined" else ())
    for nprog, bns, warps in pipelined:
        if max(4096 // bns[0], 1024 // bns[1], 3072 // bns[2], 1024 // bns[3]) > nprog:
            lines.append(f"skip nprog={nprog} bn={bns}: more tiles than programs")
            continue
        def run(nprog=nprog, bns=bns, warps=warps):
            h.copy_(h0)
            bar.zero_()
            return _layers_pipe_kernel[(nprog,)](h, qkv, act, wqkv, wo, wgu, wd, bar, L, H, QKV,
                                                 QO, I, *bns, num_warps=warps)
        key = f"pipelined nprog={nprog} bn={bns} warps={warps}"
        try:
            k = _layers_pipe_kernel[(1,)](h, qkv, act, wqkv, wo, wgu, wd, bar, L, H, QKV, QO, I,
                                          *bns, num_warps=warps)
            per_sm = min(65536 // max(1, k.n_regs * 32 * warps), 2048 // (32 * warps))
            key += f" regs={k.n_regs} spills={k.n_spills} fit/SM={per_sm}"
            if nprog > per_sm * sms:
                lines.append(f"{key}: skipped (programs cannot all be resident)")
                print(lines[-1], flush=True)
                continue
            run()
            torch.cuda.synchronize()
            err = (h.float() - want.float()).abs().max().item()
            t = _time_us(run, iters=20)
            results[key] = {"us": t, "x_roofline": t / roof_us, "max_err": err}
            lines.append(f"{key}: {t:.1f} us = {t / roof_us:.2f}x roofline (max err {err:.3g})")
        except Exception as e:  # noqa: BLE001
            lines.append(f"{key}: failed {e!r}"[:300])
        print(lines[-1], flush=True)
        with open(os.path.join(args.out, "persistent_probe.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "persistent_probe.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "persistent_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


def _copy_bandwidth(dev: torch.device) -> float:
    a = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    t = _time_us(lambda: b.copy_(a), iters=20)
    return 2 * a.numel() / (t * 1e3)   # GB/s


if __name__ == "__main__":
    main()
