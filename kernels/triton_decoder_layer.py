"""A whole decoder layer as one persistent kernel, for a few rows of a small model (the draft).

At batch 1 a 0.6B-class draft layer streams ~31 MB of weights (7.5 us at an H200's copy
bandwidth) but ran as ~9 kernels of ~4 us each: every boundary drains the GPU and every small
kernel starts its DRAM reads from cold (docs/bench-h200/persistent-probe). Here the layer is one
launch of ``nprog`` programs, all resident at once, that pass through its stages together:

    1. RMSNorm(x + residual) @ W_qkv.T (+ bias)              tiles of qkv rows
    2. q/k norm, rotary, K/V cache write                    one token per program
    3. paged attention (split-KV)                           (query tile, KV head, split) items
    4. merge of the splits (when there are several)         (token, query head) items
    5. h = x + residual + attn @ W_o.T                      tiles of hidden rows
    6. silu(gate) * up of RMSNorm(h) @ W_gate_up.T          tiles of intermediate rows
    7. out = act @ W_down.T                                 tiles of hidden rows

with a grid barrier between stages (an atomic counter and a generation word, reset by the
last program to arrive: no memset per launch). A program loads its first weight tile of the next
projection *before* it waits at the barrier, and each tile loop loads tile t + nprog while it
computes tile t, so the weight stream runs through the barriers instead of restarting after each.
Stages 2-4 call the very functions the separate prologue, attention and merge kernels run
(triton_prologue.prologue_group, triton_attention.attend_program / merge_program), so their
numerics are those kernels'. The projections round as the separate norm, linear and SiLU ops do
(the residual sum and the normalised row to the dtype, SiLU before the product; the GEMV's fused
norm prologue, which some shapes take op by op, does not round the normalised row). Their fp32
sums run in another order than the GEMV kernel's, so the layer agrees with the unfused one to
the dtype's rounding, not bit for bit.

Returns ``(mlp_out, h)`` like the unfused layer, or None where it does not apply (more than
``MAX_ROWS`` rows, a weight wider than ``MAX_K``, or off: :func:`set_enabled`), and the caller
runs the layer op by op. Nothing is read back from the device, so it runs in CUDA graphs.

Every program must be resident at once or the barrier never opens (the spin is not bounded and
the launch is not cooperative): the grid is the SM count times the programs per SM that the
compiled kernel's registers and shared memory allow, at most two (read from the compiled
kernel, not assumed; the batch-dependent integers are not specialised on, so later calls run
that same binary). Under the CPU interpreter the grid is one program (the
interpreter runs programs one after another, and one program passes every barrier alone).

**Status: off (measured slower).** On an H200 the 0.6B-like draft's 1-token forward took 977 us
with these layers against 951 us op by op (0.97x; 0.87x at 2 rows; every variant tried, 0.86-0.97x:
docs/bench-h200/fused-layer). Not timed stage by stage; likely, each of the ~6 stages pays its
own latency chain (a barrier, ~0.8-0.94 us in the probe, then L2 reads of the stage's input, a
reduction, the stores), and the attention stages gain nothing from the weight prefetch. The code stays as the tested base of a
persistent draft forward (its GPU tests pass on an H100 and fail with the barriers removed);
:func:`set_enabled` is for benches and tests, and no engine flag turns it on.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from specserve.kernels.decoder_weights import DecoderWeights
from specserve.kernels.triton_attention import (_choose_splits, _num_sms, attend_program,
                                                launch_shape, merge_program)
from specserve.kernels.interpreter import interpreting
from specserve.kernels.jit_keys import settle_cache_keys
from specserve.kernels.triton_gemv import silu_mul
from specserve.kernels.triton_prologue import prologue_group

# Rows: batch 1 (one token; the draft's catch-up feeds two). At 4 and 8 rows a first version
# ran the draft at 0.70x / 0.51x the op-by-op layers on an H200 (each row made its own pass over
# the tile); those batches run op by op.
MAX_ROWS = 2
MAX_K = 4096           # widest input of a projection (hidden, Hq * D, intermediate)
TILE_ELEMS = 16384     # weight elements per program tile (about one tile per program)
NUM_WARPS = 4

_enabled = False
force_splits: Optional[int] = None   # tests: the attention's split count (a power of two)


def enabled() -> bool:
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn the fused layer on or off for later calls (captured graphs keep what they had)."""
    global _enabled
    _enabled = bool(flag)


# ---- device functions --------------------------------------------------------------------------
@triton.jit
def _grid_sync(bar_ptr, nprog):
    """Wait until all ``nprog`` programs have arrived. bar_ptr[0] counts arrivals, bar_ptr[1] is
    the generation: the last to arrive resets the count and opens the barrier by bumping it."""
    tl.debug_barrier()                      # this program's stores happen before its arrival
    gen = tl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu")
    arrived = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == nprog - 1:
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(bar_ptr + 1, 1, sem="release", scope="gpu")
    else:
        seen = tl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu")
        while seen == gen:
            seen = tl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _w_tile(w_ptr, t, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr):
    """Rows t * BN .. of a row-major [N, K] weight, whole rows ([BN, KP], zeros past N or K;
    a tile past the last one loads nothing)."""
    n = t * BN + tl.arange(0, BN)
    kk = tl.arange(0, KP)
    return tl.load(w_ptr + n[:, None].to(tl.int64) * K + kk[None, :],
                   mask=(n[:, None] < N) & (kk[None, :] < K), other=0.0)


@triton.jit
def _next_tile(w, w_ptr, t, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr,
               MULTI: tl.constexpr):
    """The program's next tile, loaded while it computes the current one; without MULTI (no
    program has a second tile) nothing is loaded and no registers are held for it."""
    if MULTI:
        return _w_tile(w_ptr, t, N, K, KP, BN)
    return w


@triton.jit
def _residual_row(x_ptr, res_ptr, m, K: tl.constexpr, KP: tl.constexpr, HAS_RES: tl.constexpr):
    """Row m of x + residual, rounded to the dtype like the add_rms_norm kernel ([KP])."""
    kk = tl.arange(0, KP)
    x = tl.load(x_ptr + m * K + kk, mask=kk < K, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + m * K + kk, mask=kk < K, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _inv_rms(x_ptr, res_ptr, M, eps, K: tl.constexpr, KP: tl.constexpr, BM: tl.constexpr,
             HAS_RES: tl.constexpr):
    """rsqrt(mean(h^2) + eps) of every row h = x (+ res) (rounded to the dtype), as [BM]: one
    reduction per stage, not one per tile."""
    rows = tl.arange(0, BM)
    kk = tl.arange(0, KP)
    mask = (rows[:, None] < M) & (kk[None, :] < K)
    offs = rows[:, None] * K + kk[None, :]
    h = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + offs, mask=mask, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(h.dtype)
    hf = h.to(tl.float32)
    return tl.rsqrt(tl.sum(hf * hf, axis=1) / K + eps)


@triton.jit
def _normed(h, inv, m, nw_ptr, K: tl.constexpr, KP: tl.constexpr, BM: tl.constexpr):
    """Row m's RMSNorm, h ([KP] in the dtype) and ``inv`` from _inv_rms, rounded like rms_norm:
    normalised in fp32, rounded, times the weight, rounded. Returned in fp32."""
    kk = tl.arange(0, KP)
    inv_m = tl.sum(tl.where(tl.arange(0, BM) == m, inv, 0.0), axis=0)
    w = tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    return ((h.to(tl.float32) * inv_m).to(h.dtype).to(tl.float32) * w).to(h.dtype).to(tl.float32)


@triton.jit
def _plain_row(x_ptr, m, K: tl.constexpr, KP: tl.constexpr):
    kk = tl.arange(0, KP)
    return tl.load(x_ptr + m * K + kk, mask=kk < K, other=0.0).to(tl.float32)


@triton.jit
def _bias(b_ptr, n, N, acc, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _stage_norm_linear(w, x_ptr, res_ptr, nw_ptr, eps, w_ptr, b_ptr, out_ptr, M, N, pid, nprog,
                       HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, K: tl.constexpr,
                       KP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                       MULTI: tl.constexpr):
    """out[m] = rms_norm(x[m] + res[m]) @ W.T (+ b) for this program's tiles; ``w`` is its first
    tile, already loaded."""
    inv = _inv_rms(x_ptr, res_ptr, M, eps, K, KP, BM, HAS_RES)
    t = pid
    while t < tl.cdiv(N, BN):
        w_next = _next_tile(w, w_ptr, t + nprog, N, K, KP, BN, MULTI)
        n = t * BN + tl.arange(0, BN)
        for m in tl.static_range(BM):
            if m < M:
                x = _normed(_residual_row(x_ptr, res_ptr, m, K, KP, HAS_RES), inv, m, nw_ptr, K,
                            KP, BM)
                acc = _bias(b_ptr, n, N, tl.sum(w.to(tl.float32) * x[None, :], axis=1), HAS_BIAS)
                tl.store(out_ptr + m * N + n, acc.to(out_ptr.dtype.element_ty), mask=n < N)
        w = w_next
        t += nprog


@triton.jit
def _stage_linear(w, x_ptr, w_ptr, b_ptr, out_ptr, add_ptr, add_res_ptr, M, N, pid, nprog,
                  ADD_INPUT: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                  K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                  MULTI: tl.constexpr):
    """out[m] = x[m] @ W.T (+ b), rounded; ADD_INPUT: out[m] += add[m] (+ add_res[m]) (the
    layer's input residual sum, rounded as in _residual_row), the sum rounded like a dtype add."""
    t = pid
    while t < tl.cdiv(N, BN):
        w_next = _next_tile(w, w_ptr, t + nprog, N, K, KP, BN, MULTI)
        n = t * BN + tl.arange(0, BN)
        for m in tl.static_range(BM):
            if m < M:
                acc = _bias(b_ptr, n, N,
                            tl.sum(w.to(tl.float32) * _plain_row(x_ptr, m, K, KP)[None, :], axis=1),
                            HAS_BIAS)
                y = acc.to(out_ptr.dtype.element_ty)
                if ADD_INPUT:
                    h = tl.load(add_ptr + m * N + n, mask=n < N, other=0.0)
                    if HAS_RES:
                        r = tl.load(add_res_ptr + m * N + n, mask=n < N, other=0.0)
                        h = (h.to(tl.float32) + r.to(tl.float32)).to(h.dtype)
                    y = (y.to(tl.float32) + h.to(tl.float32)).to(out_ptr.dtype.element_ty)
                tl.store(out_ptr + m * N + n, y, mask=n < N)
        w = w_next
        t += nprog


@triton.jit
def _stage_norm_silu(wg, wu, h_ptr, nw_ptr, eps, w_ptr, b_ptr, act_ptr, M, N, pid, nprog,
                     HAS_BIAS: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr,
                     BM: tl.constexpr, MULTI: tl.constexpr):
    """act[m] = silu(gate) * up with (gate | up) = rms_norm(h[m]) @ W_gate_up.T (+ b); the
    weight holds N gate rows then N up rows. ``wg`` / ``wu``: the first tile's halves."""
    inv = _inv_rms(h_ptr, h_ptr, M, eps, K, KP, BM, False)
    t = pid
    while t < tl.cdiv(N, BN):
        wg_next = _next_tile(wg, w_ptr, t + nprog, N, K, KP, BN, MULTI)
        wu_next = _next_tile(wu, w_ptr + N * K, t + nprog, N, K, KP, BN, MULTI)
        n = t * BN + tl.arange(0, BN)
        for m in tl.static_range(BM):
            if m < M:
                x = _normed(_residual_row(h_ptr, h_ptr, m, K, KP, False), inv, m, nw_ptr, K, KP,
                            BM)
                g = _bias(b_ptr, n, N, tl.sum(wg.to(tl.float32) * x[None, :], axis=1), HAS_BIAS)
                u = _bias(b_ptr + N, n, N, tl.sum(wu.to(tl.float32) * x[None, :], axis=1),
                          HAS_BIAS)
                act = silu_mul(g.to(act_ptr.dtype.element_ty), u.to(act_ptr.dtype.element_ty))
                tl.store(act_ptr + m * N + n, act, mask=n < N)
        wg = wg_next
        wu = wu_next
        t += nprog


# Integers that change with the batch are not specialised on (see triton_attention.MIX_ARGS:
# a variant first met under load stalls every request while it compiles).
@triton.jit(do_not_specialize=["stride_bt", "num_reqs", "num_att_tiles", "M"])
def _decoder_layer_kernel(
    x_ptr, res_ptr, out_ptr, h_ptr,
    ln1_ptr, ln2_ptr, eps,
    wqkv_ptr, bqkv_ptr, wo_ptr, bo_ptr, wgu_ptr, bgu_ptr, wd_ptr, bd_ptr,
    qkv_buf, q_buf, attn_buf, act_buf, ws_acc, ws_ml, bar_ptr,
    qn_ptr, kn_ptr, pos_ptr, cos_sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
    stride_cache, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, stride_bt, scale, num_reqs,
    num_att_tiles, M,
    H: tl.constexpr, HP: tl.constexpr, NQKV: tl.constexpr, QO: tl.constexpr, QOP: tl.constexpr,
    I: tl.constexpr, HAS_RES: tl.constexpr, QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr,
    GU_BIAS: tl.constexpr, D_BIAS: tl.constexpr, BM: tl.constexpr, BN_QKV: tl.constexpr,
    BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr, IP: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HAS_NORM: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    ATT_D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr,
    MULTI_QKV: tl.constexpr, MULTI_O: tl.constexpr, MULTI_GU: tl.constexpr,
    MULTI_D: tl.constexpr,
):
    """The seven stages of the module docstring; every program runs this whole body."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    # 1. qkv = rms_norm(x + res) @ W_qkv.T
    w = _w_tile(wqkv_ptr, pid, NQKV, H, HP, BN_QKV)
    _stage_norm_linear(w, x_ptr, res_ptr, ln1_ptr, eps, wqkv_ptr, bqkv_ptr, qkv_buf, M, NQKV,
                       pid, nprog, HAS_RES, QKV_BIAS, H, HP, BN_QKV, BM, MULTI_QKV)
    _grid_sync(bar_ptr, nprog)

    # 2. q/k norm + rotary; k, v -> cache: one (token, KV head) per work item
    item = pid
    while item < M * NUM_KV_HEADS:
        prologue_group((item // NUM_KV_HEADS).to(tl.int64), item % NUM_KV_HEADS, qkv_buf, q_buf,
                       k_cache_ptr, v_cache_ptr, qn_ptr, kn_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
                       eps, True, NQKV, QO, stride_cache, stride_kb, stride_ks, stride_vb,
                       stride_vs, NUM_Q_HEADS, NUM_KV_HEADS, GROUP, GROUP_PAD, HAS_NORM,
                       HEAD_DIM, D_PAD, HALF, HALF_PAD, TAIL, TAIL_PAD, BLOCK_SIZE)
        item += nprog
    _grid_sync(bar_ptr, nprog)

    # 3. attention (4. merge), the o projection's first tile in flight before the last wait
    item = pid
    per_tile = NUM_KV_HEADS * NUM_SPLITS
    while item < num_att_tiles * per_tile:
        attend_program(item // per_tile, num_att_tiles, (item // NUM_SPLITS) % NUM_KV_HEADS,
                       item % NUM_SPLITS, q_buf, k_cache_ptr, v_cache_ptr, attn_buf,
                       block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, ws_acc, ws_ml, scale,
                       num_reqs, M, QO, HEAD_DIM, 1, stride_kb, stride_ks, stride_kh, 1,
                       stride_vb, stride_vs, stride_vh, 1, QO, HEAD_DIM, stride_bt,
                       NUM_Q_HEADS, GROUP, GROUP_PAD, HEAD_DIM, ATT_D_PAD, BLOCK_SIZE, BLOCK_Q,
                       BLOCK_N, NUM_SPLITS, PRECISION, WHILE_LOOP)
        item += nprog
    if NUM_SPLITS > 1:
        _grid_sync(bar_ptr, nprog)
        item = pid
        while item < M * NUM_Q_HEADS:
            merge_program((item // NUM_Q_HEADS).to(tl.int64), item % NUM_Q_HEADS, ws_acc, ws_ml,
                          attn_buf, query_start_loc_ptr, num_reqs, M, QO, HEAD_DIM, NUM_Q_HEADS,
                          HEAD_DIM, ATT_D_PAD, NUM_SPLITS)
            item += nprog
    w = _w_tile(wo_ptr, pid, H, QO, QOP, BN_O)
    _grid_sync(bar_ptr, nprog)

    # 5. h = x + res + attn @ W_o.T
    _stage_linear(w, attn_buf, wo_ptr, bo_ptr, h_ptr, x_ptr, res_ptr, M, H, pid, nprog, True,
                  HAS_RES, O_BIAS, QO, QOP, BN_O, BM, MULTI_O)
    wg = _w_tile(wgu_ptr, pid, I, H, HP, BN_GU)
    wu = _w_tile(wgu_ptr + I * H, pid, I, H, HP, BN_GU)
    _grid_sync(bar_ptr, nprog)

    # 6. act = silu(gate) * up of rms_norm(h) @ W_gate_up.T
    _stage_norm_silu(wg, wu, h_ptr, ln2_ptr, eps, wgu_ptr, bgu_ptr, act_buf, M, I, pid, nprog,
                     GU_BIAS, H, HP, BN_GU, BM, MULTI_GU)
    w = _w_tile(wd_ptr, pid, H, I, IP, BN_D)
    _grid_sync(bar_ptr, nprog)

    # 7. out = act @ W_down.T
    _stage_linear(w, act_buf, wd_ptr, bd_ptr, out_ptr, h_ptr, h_ptr, M, H, pid, nprog, False,
                  False, D_BIAS, I, IP, BN_D, BM, MULTI_D)


# ---- host side ---------------------------------------------------------------------------------
def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _block_n(n: int, k_pad: int, nprog: int, pair: bool = False) -> int:
    """Rows per weight tile: about one tile per program, at most TILE_ELEMS elements (two
    tiles' halves when ``pair``)."""
    cap = max(1, TILE_ELEMS // (k_pad * (2 if pair else 1)))
    want = _pow2(-(-n // nprog))
    return max(1, min(want, 1 << (cap.bit_length() - 1)))


@functools.lru_cache(maxsize=None)
def _programs_per_sm(index: int, regs: int, shared: int, warps: int) -> int:
    """How many programs of a compiled kernel an SM holds at once (registers, shared memory,
    threads), at least 1."""
    props = torch.cuda.get_device_properties(index)
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_regs = regs_per_sm // max(1, (-(-regs // 8) * 8) * 32 * warps)
    by_threads = threads_per_sm // (32 * warps)
    by_smem = smem_per_sm // (shared + 1024)   # the driver reserves 1 KB of shared memory a block
    return max(1, min(by_regs, by_threads, by_smem, 32))


def decoder_layer(x: torch.Tensor, residual: Optional[torch.Tensor], w: DecoderWeights,
                  positions: torch.Tensor, cos_sin_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                  seq_lens: torch.Tensor, max_query_len: int, max_seq_len: int,
                  k_cache: torch.Tensor, v_cache: torch.Tensor
                  ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The layer as one launch -> (mlp_out, h), or None where this path does not apply."""
    if not _fits(x, residual, w, k_cache, v_cache, cos_sin_cache):
        return None
    m, hidden = x.shape
    dev = x.device
    hq, hk, d = w.num_heads, w.num_kv_heads, w.head_dim
    n_qkv, qo, inter = w.qkv.shape[0], hq * d, w.down.shape[1]
    out = torch.empty_like(x)
    h = torch.empty_like(x)
    qkv_buf = torch.empty((m, n_qkv), dtype=x.dtype, device=dev)
    q_buf = torch.empty((m, hq, d), dtype=x.dtype, device=dev)
    attn_buf = torch.empty((m, hq, d), dtype=x.dtype, device=dev)
    act_buf = torch.empty((m, inter), dtype=x.dtype, device=dev)

    interp = interpreting()
    index = 0 if interp else (dev.index if dev.index is not None else torch.cuda.current_device())
    sms = 1 if interp else _num_sms(dev)
    # attention's launch shape and splits, as triton_attention.paged_attention picks them
    group, group_pad, att_d_pad, _, block_n, block_q = launch_shape(hq, hk, d, max_query_len,
                                                                    x.element_size())
    num_reqs = seq_lens.shape[0]
    num_att_tiles = m // block_q + num_reqs
    splits = force_splits or _choose_splits(num_att_tiles * hk, max_query_len, max_seq_len,
                                            block_q, dev)
    if splits > 1:
        ws_acc = torch.empty((splits, m, hq, att_d_pad), dtype=torch.float32, device=dev)
        ws_ml = torch.empty((2, splits, m, hq), dtype=torch.float32, device=dev)
    else:
        ws_acc = ws_ml = attn_buf   # unused
    hp, qop, ip = _pow2(hidden), _pow2(qo), _pow2(inter)
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    half = cache.shape[1] // 2
    tail = d - 2 * half
    has_norm = w.q_norm is not None
    base = dict(
        H=hidden, HP=hp, NQKV=n_qkv, QO=qo, QOP=qop, I=inter, IP=ip,
        HAS_RES=residual is not None, QKV_BIAS=w.qkv_bias is not None,
        O_BIAS=w.o_bias is not None, GU_BIAS=w.gate_up_bias is not None,
        D_BIAS=w.down_bias is not None, BM=_pow2(m),
        NUM_Q_HEADS=hq, NUM_KV_HEADS=hk, HAS_NORM=has_norm, HEAD_DIM=d, D_PAD=_pow2(d),
        HALF=half, HALF_PAD=_pow2(half), TAIL=tail, TAIL_PAD=_pow2(tail),
        BLOCK_SIZE=k_cache.shape[1], GROUP=group,
        GROUP_PAD=group_pad, ATT_D_PAD=att_d_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
        NUM_SPLITS=splits, PRECISION="ieee" if x.element_size() == 4 else None,
        WHILE_LOOP=interp)
    args = (x, residual if residual is not None else x, out, h, w.input_norm, w.post_norm, w.eps,
            w.qkv, _or(w.qkv_bias, w.qkv), w.o, _or(w.o_bias, w.o), w.gate_up,
            _or(w.gate_up_bias, w.gate_up), w.down, _or(w.down_bias, w.down),
            qkv_buf, q_buf, attn_buf, act_buf, ws_acc, ws_ml, w.barrier,
            w.q_norm if has_norm else x, w.k_norm if has_norm else x, positions, cache,
            slot_mapping, k_cache, v_cache, cache.stride(0), k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables, query_start_loc, seq_lens, block_tables.stride(0), w.scale, num_reqs,
            num_att_tiles, m)
    if interp:
        constexprs, grid = {**base, **_tiles(base, 1)}, 1
    else:
        constexprs, grid = _plan(index, sms, x.dtype, base, args)
    _decoder_layer_kernel[(grid,)](*args, num_warps=NUM_WARPS, **constexprs)
    return out, h


def _tiles(base: dict, nprog: int) -> dict:
    """Weight-tile rows per projection for ``nprog`` programs, and which projections leave some
    program a second tile (MULTI_*: it then loads tile t + nprog while computing tile t)."""
    bn = {"QKV": _block_n(base["NQKV"], base["HP"], nprog),
          "O": _block_n(base["H"], base["QOP"], nprog),
          "GU": _block_n(base["I"], base["HP"], nprog, pair=True),
          "D": _block_n(base["H"], base["IP"], nprog)}
    rows = {"QKV": base["NQKV"], "O": base["H"], "GU": base["I"], "D": base["H"]}
    out = {f"BN_{k}": v for k, v in bn.items()}
    out.update({f"MULTI_{k}": -(-rows[k] // bn[k]) > nprog for k in bn})
    return out


_plans: dict = {}       # launch key -> (constexprs, grid)
launch_info: dict = {}  # launch key -> what was compiled and launched (benches print it)


def _plan(index: int, sms: int, dtype: torch.dtype, base: dict, args: tuple) -> tuple[dict, int]:
    """Tiles and grid for a launch, found once per key: aim at two programs per SM, compile,
    read how many the compiled kernel really fits, and re-tile for that many if fewer."""
    key = (index, dtype, NUM_WARPS, TILE_ELEMS, tuple(sorted(base.items())))
    plan = _plans.get(key)
    if plan is not None:
        return plan
    target = 2 * sms
    while True:
        constexprs = {**base, **_tiles(base, target)}
        compiled = _decoder_layer_kernel.warmup(*args, grid=(1,), num_warps=NUM_WARPS,
                                                **constexprs)
        getattr(compiled, "_init_handles", lambda: None)()   # loads it: n_regs is known
        per_sm = _programs_per_sm(index, compiled.n_regs, compiled.metadata.shared, NUM_WARPS)
        resident = sms * min(per_sm, 2)
        if resident >= target:
            break
        target = resident                                    # one program per SM: re-tile
    launch_info[key] = dict(rows=base["BM"], n_regs=compiled.n_regs, n_spills=compiled.n_spills,
                            shared=compiled.metadata.shared, per_sm=per_sm, grid=target,
                            splits=base["NUM_SPLITS"],
                            tiles={k: v for k, v in constexprs.items()
                                   if k.startswith(("BN_", "MULTI_"))})
    _plans[key] = (constexprs, target)
    return constexprs, target


def _or(t: Optional[torch.Tensor], dummy: torch.Tensor) -> torch.Tensor:
    return t if t is not None else dummy


def _fits(x: torch.Tensor, residual: Optional[torch.Tensor], w: DecoderWeights,
          k_cache: torch.Tensor, v_cache: torch.Tensor, cos_sin_cache: torch.Tensor) -> bool:
    """Whether this call can take the fused path (else the caller runs the layer op by op)."""
    if not _enabled or w.barrier is None or not (x.is_cuda or interpreting()):
        return False
    m = x.shape[0]
    if not 1 <= m <= MAX_ROWS or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if max(x.shape[1], w.num_heads * w.head_dim, w.down.shape[1]) > MAX_K:
        return False
    if not x.is_contiguous() or (residual is not None and not residual.is_contiguous()):
        return False
    tensors = [w.qkv, w.o, w.gate_up, w.down]
    if any(not t.is_contiguous() or t.dtype != x.dtype for t in tensors):
        return False
    for c in (k_cache, v_cache):
        if c.stride(-1) != 1 or c.stride(-2) != w.head_dim:
            return False
    return w.num_heads % w.num_kv_heads == 0 and cos_sin_cache.shape[1] <= w.head_dim


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
