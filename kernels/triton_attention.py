"""Triton paged attention for ragged batches: prefill chunks, decodes and k+1 verifications in one launch.

Twin of :func:`kernels.ref_layers.paged_attention` (same signature, same cache layout).

Work decomposition. Each request's query rows are cut into tiles of ``BLOCK_Q`` tokens; a tile
holds those tokens for all ``G = Hq / Hk`` query heads that share one KV head, so a program works
on ``BLOCK_M = BLOCK_Q * G_PAD`` rows against one KV head (GQA costs no extra K/V reads, and a
decode token's G heads fill the rows of one tensor-core tile). Tiles are numbered without a host
sync: request ``r``'s tiles start at ``query_start_loc[r] // BLOCK_Q + r``, so
``num_tokens // BLOCK_Q + num_reqs`` programs cover every request and each program finds its
request by binary search over ``query_start_loc``. Programs past a request's last tile exit.

Each program walks the context in ``BLOCK_N``-token steps, looking up every token's block in the
block table, with an online (flash) softmax in fp32 and a causal mask on absolute positions.
For decode-heavy batches with few programs, the context is split over ``NUM_SPLITS`` programs
(split-KV): each writes an unnormalised partial (acc, max, sum) and a second kernel merges them,
writing every row of the output (rows past the last request's queries, batch padding, as zeros).
Without splits the tiles' programs share out the padding rows and zero them, so the output is
never memset. (A merge inside the attention kernel, by the last program of a tile to draw a ticket from
an atomic counter, measured slower on an H100 at batch 1 than this second kernel:
docs/bench-h100/attention-ticket-merge.)
All launch parameters come from tensor shapes and the caller's host-side bounds
(``max_query_len``, ``max_seq_len``); nothing is read back from the device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from specserve.kernels import triton_pdl
from specserve.kernels.interpreter import interpreting
from specserve.kernels.jit_keys import settle_cache_keys
from specserve.kernels.triton_pdl import after_producer

_MIN_TOKENS_PER_SPLIT = 128


@triton.jit
def find_request(query_start_loc, tile, num_reqs, BLOCK_Q: tl.constexpr):
    """The last request r with query_start_loc[r] // BLOCK_Q + r <= tile (binary search)."""
    lo = tl.zeros([], tl.int32)            # tensors from the start: loop-carried types must not change
    hi = tl.zeros([], tl.int32) + num_reqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(query_start_loc + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _attend_tile(q, m_i, l_i, acc, q_pos, start_n, kv_hi, table_row, k_base, v_base, d_ok, scale,
                 stride_kb, stride_ks, stride_vb, stride_vs,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step over context positions [start_n, start_n + BLOCK_N) ∩ [0, kv_hi)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                    # [BLOCK_N] absolute positions
    n_ok = offs_n < kv_hi
    block = tl.load(table_row + offs_n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
    in_block = offs_n % BLOCK_SIZE
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(k_base + block[:, None] * stride_kb + in_block[:, None] * stride_ks,
                mask=kv_mask, other=0.0)                        # [BLOCK_N, D_PAD]
    v = tl.load(v_base + block[:, None] * stride_vb + in_block[:, None] * stride_vs,
                mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale      # [BLOCK_M, BLOCK_N]
    visible = n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # rows that saw nothing yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])                             # [BLOCK_M, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def split_share(seq_len, context, q_tile, split, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                NUM_SPLITS: tl.constexpr):
    """[kv_lo, kv_hi): the context positions query tile ``q_tile`` of a request attends to in
    split ``split``: the context the tile needs, cut into NUM_SPLITS shares of whole BLOCK_N
    steps (the fused decode attention asks it which split holds the new position)."""
    kv_end = tl.minimum(seq_len, context + (q_tile + 1) * BLOCK_Q)
    per_split = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
    kv_lo = split * per_split
    return kv_lo, tl.minimum(kv_end, kv_lo + per_split)


@triton.jit
def _store_partial_or_final(out_ptr, ws_acc_ptr, ws_ml_ptr, acc, m_i, l_i, row, head, row_ok,
                            offs_d, d_ok, split, num_tokens, stride_ot, stride_oh,
                            NUM_Q_HEADS: tl.constexpr, D_PAD: tl.constexpr,
                            NUM_SPLITS: tl.constexpr):
    """One split: normalise and store the output. Several: store (acc, m, l) for the merge."""
    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + row[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        # workspace: acc [NUM_SPLITS, num_tokens, Hq, D_PAD], (m, l) [2, NUM_SPLITS, num_tokens, Hq]
        ml = (split * num_tokens + row) * NUM_Q_HEADS + head                 # [BLOCK_M]
        tl.store(ws_acc_ptr + ml[:, None] * D_PAD + offs_d[None, :], acc, mask=row_ok[:, None])
        tl.store(ws_ml_ptr + ml, m_i, mask=row_ok)
        tl.store(ws_ml_ptr + NUM_SPLITS * num_tokens * NUM_Q_HEADS + ml, l_i, mask=row_ok)


@triton.jit
def _zero_padding_rows(out_ptr, query_start_loc_ptr, num_reqs, num_tokens, tile, num_tiles, head,
                       head_ok, offs_d, d_ok, stride_ot, stride_oh, BLOCK_Q: tl.constexpr,
                       GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr, D_PAD: tl.constexpr):
    """Zero the given query heads in this tile's share of the rows past the last request's
    queries (batch padding, which no tile owns; the output is allocated uninitialised): blocks
    of BLOCK_Q rows ``tile``, ``tile + num_tiles``, ... of the padding."""
    offs_r = tl.arange(0, BLOCK_M) // GROUP_PAD
    zeros = tl.zeros([BLOCK_M, D_PAD], tl.float32).to(out_ptr.dtype.element_ty)
    r = tl.load(query_start_loc_ptr + num_reqs) + tile * BLOCK_Q
    while r < num_tokens:
        row = (r + offs_r).to(tl.int64)
        ok = (row < num_tokens) & head_ok
        ptrs = out_ptr + row[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(ptrs, zeros, mask=ok[:, None] & d_ok[None, :])
        r += num_tiles * BLOCK_Q


# Integer arguments that change with the request mix are not specialised on (Triton compiles a
# variant per value class of an int argument: 1, a multiple of 16, or neither). Specialised, the
# block table's row stride (the widest request's block count) and the request count made a
# variant the start-up warm-up had not met: compiled under serve-load on an H100, it stalled
# every running request for 0.4-0.8 s (TTFT p99 970 ms at concurrency 64, against ~210 ms in
# the runs before and after it; docs/bench-h100/serve-three-runs-b).
MIX_ARGS = ["num_reqs", "num_tokens", "stride_bt"]


@triton.jit(do_not_specialize=MIX_ARGS)
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    ws_acc_ptr, ws_ml_ptr,
    scale, num_reqs, num_tokens,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_bt,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr, PDL: tl.constexpr = False,
):
    """Grid (tiles, Hk, NUM_SPLITS): one query tile x one KV head x one share of the context.
    ``PDL``: launched ahead of the kernel before it (kernels/triton_pdl.py)."""
    after_producer(PDL)
    attend_program(
        tl.program_id(0), tl.num_programs(0), tl.program_id(1), tl.program_id(2),
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr,
        seq_lens_ptr, ws_acc_ptr, ws_ml_ptr, scale, num_reqs, num_tokens,
        stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
        stride_vb, stride_vs, stride_vh, stride_vd, stride_ot, stride_oh, stride_bt,
        NUM_Q_HEADS, GROUP, GROUP_PAD, HEAD_DIM, D_PAD, BLOCK_SIZE, BLOCK_Q, BLOCK_N, NUM_SPLITS,
        PRECISION, WHILE_LOOP)


@triton.jit
def attend_program(
    tile, num_tiles, kv_head, split,
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    ws_acc_ptr, ws_ml_ptr,
    scale, num_reqs, num_tokens,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_bt,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr,
):
    """The work of one (query tile, KV head, split) of the kernel above, as a function: the
    kernel's programs call it once, the persistent decoder layer (triton_decoder_layer) once per
    work item it takes."""
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    offs_m = tl.arange(0, BLOCK_M)
    head_in_group = offs_m % GROUP_PAD
    head = kv_head * GROUP + head_in_group                      # [BLOCK_M] query head
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    if NUM_SPLITS == 1:             # with splits the merge kernel writes the padding rows
        _zero_padding_rows(out_ptr, query_start_loc_ptr, num_reqs, num_tokens, tile,
                           num_tiles, head, head_in_group < GROUP, offs_d, d_ok,
                           stride_ot, stride_oh, BLOCK_Q, GROUP_PAD, BLOCK_M, D_PAD)

    req = find_request(query_start_loc_ptr, tile, num_reqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    q_tile = tile - (q_start // BLOCK_Q + req)
    if q_tile * BLOCK_Q < q_len:    # (not an early return: this body runs inside loops too)
        _attend_tile_range(
            q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, ws_acc_ptr,
            ws_ml_ptr, scale, num_tokens, req, q_start, q_len, q_tile, kv_head, split, offs_m,
            head_in_group, head, offs_d, d_ok,
            stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
            stride_vb, stride_vs, stride_vh, stride_vd, stride_ot, stride_oh, stride_bt,
            NUM_Q_HEADS, GROUP, GROUP_PAD, D_PAD, BLOCK_SIZE, BLOCK_Q, BLOCK_N, NUM_SPLITS,
            PRECISION, WHILE_LOOP)


@triton.jit
def _attend_tile_range(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, ws_acc_ptr,
    ws_ml_ptr, scale, num_tokens, req, q_start, q_len, q_tile, kv_head, split, offs_m,
    head_in_group, head, offs_d, d_ok,
    stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd, stride_ot, stride_oh, stride_bt,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr,
):
    """A query tile that holds queries: attend its share of the context, store the result."""
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    seq_len = tl.load(seq_lens_ptr + req)
    context = seq_len - q_len                                   # tokens cached before this step

    tok = q_tile * BLOCK_Q + offs_m // GROUP_PAD                # [BLOCK_M] query index in request
    row_ok = (tok < q_len) & (head_in_group < GROUP)
    q_pos = context + tok                                       # [BLOCK_M] absolute position

    row = (q_start + tok).to(tl.int64)
    q_ptrs = q_ptr + row[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)   # [BLOCK_M, D_PAD]

    kv_lo, kv_hi = split_share(seq_len, context, q_tile, split, BLOCK_Q, BLOCK_N, NUM_SPLITS)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    table_row = block_tables_ptr + req.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh + offs_d[None, :] * stride_kd
    v_base = v_cache_ptr + kv_head * stride_vh + offs_d[None, :] * stride_vd
    if WHILE_LOOP:  # the CPU interpreter cannot run `range` over device scalars
        start_n = kv_lo
        while start_n < kv_hi:
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, q_pos, start_n, kv_hi, table_row, k_base, v_base, d_ok, scale,
                stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, BLOCK_N, PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(kv_lo, kv_hi, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, q_pos, start_n, kv_hi, table_row, k_base, v_base, d_ok, scale,
                stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, BLOCK_N, PRECISION)

    _store_partial_or_final(out_ptr, ws_acc_ptr, ws_ml_ptr, acc, m_i, l_i, row, head, row_ok,
                            offs_d, d_ok, split, num_tokens, stride_ot, stride_oh,
                            NUM_Q_HEADS, D_PAD, NUM_SPLITS)


@triton.jit(do_not_specialize=["num_reqs", "num_tokens"])
def _merge_splits_kernel(
    ws_acc_ptr, ws_ml_ptr, out_ptr, query_start_loc_ptr, num_reqs, num_tokens, stride_ot, stride_oh,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[t, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. ``PDL``: see
    kernels/triton_pdl.py.

    Every split of an owned row wrote its (m, l, acc), an empty share as m = -inf; rows past the
    last request's queries (batch padding) were never written and come out as zeros."""
    after_producer(PDL)
    merge_program(tl.program_id(0).to(tl.int64), tl.program_id(1), ws_acc_ptr, ws_ml_ptr,
                  out_ptr, query_start_loc_ptr, num_reqs, num_tokens, stride_ot, stride_oh,
                  NUM_Q_HEADS, HEAD_DIM, D_PAD, NUM_SPLITS)


@triton.jit
def merge_program(t, h, ws_acc_ptr, ws_ml_ptr, out_ptr, query_start_loc_ptr, num_reqs, num_tokens,
                  stride_ot, stride_oh, NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  D_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """The merge of one (token, query head), as a function (see attend_program)."""
    offs_d = tl.arange(0, D_PAD)
    if t >= tl.load(query_start_loc_ptr + num_reqs):
        tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d,
                 tl.zeros([D_PAD], tl.float32).to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)
    else:
        _merge_row(t, h, ws_acc_ptr, ws_ml_ptr, out_ptr, num_tokens, stride_ot, stride_oh,
                   NUM_Q_HEADS, HEAD_DIM, D_PAD, NUM_SPLITS)


@triton.jit
def _merge_row(t, h, ws_acc_ptr, ws_ml_ptr, out_ptr, num_tokens, stride_ot, stride_oh,
               NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
               NUM_SPLITS: tl.constexpr):
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, D_PAD)
    ml = (offs_s * num_tokens + t) * NUM_Q_HEADS + h                        # [NUM_SPLITS]
    m = tl.load(ws_ml_ptr + ml)
    seen = m > float("-inf")                                                # split saw context
    l = tl.load(ws_ml_ptr + NUM_SPLITS * num_tokens * NUM_Q_HEADS + ml, mask=seen, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(seen, tl.exp(m - m_max), 0.0)                              # [NUM_SPLITS]
    acc = tl.load(ws_acc_ptr + ml[:, None] * D_PAD + offs_d[None, :], mask=seen[:, None], other=0.0)
    num = tl.sum(acc * w[:, None], axis=0)                                  # [D_PAD]
    den = tl.sum(l * w, axis=0)
    o = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


def _new_output(shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The output [N, Hq, D], uninitialised (a test fills it with NaN to see every row written)."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _choose_splits(num_programs: int, max_query_len: Optional[int], max_seq_len: Optional[int],
                   block_q: int, device: torch.device) -> int:
    """Split the context when short-query tiles alone would leave most SMs idle."""
    if max_query_len is None or max_seq_len is None or max_query_len > block_q:
        return 1
    target = 2 * _num_sms(device)
    splits = 1
    while (splits * 2 * num_programs <= target
           and max_seq_len >= splits * 2 * _MIN_TOKENS_PER_SPLIT and splits < 64):
        splits *= 2
    return splits


def launch_shape(num_q_heads: int, num_kv_heads: int, head_dim: int,
                 max_query_len: Optional[int], element_size: int) -> tuple[int, int, int, int, int, int]:
    """(group, group_pad, d_pad, rows, block_n, block_q): the tile shape of a launch, shared by
    :func:`paged_attention` and the fused decoder layer (triton_decoder_layer)."""
    group = num_q_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    d_pad = max(16, triton.next_power_of_2(head_dim))
    if max_query_len is not None and max_query_len * group_pad <= 16:
        rows = max(16, group_pad)       # decode / short verification: one small tile
    elif max_query_len is not None and max_query_len * group_pad >= 512:
        rows = max(128, group_pad)      # long prefill: big tiles
    else:
        rows = max(64, group_pad)
    block_n = 64 if d_pad <= 128 else 32
    if element_size == 4:               # fp32 tiles take twice the shared memory
        rows, block_n = min(rows, max(64, group_pad)), 32
    return group, group_pad, d_pad, rows, block_n, rows // group_pad


@dataclass(frozen=True)
class Launch:
    """The shape of one attention launch and its buffers, shared by :func:`paged_attention` and
    the decode attention with its prologue inside (triton_decode_attention)."""

    group: int
    group_pad: int
    d_pad: int
    rows: int
    block_n: int
    block_q: int
    num_tiles: int
    splits: int
    out: torch.Tensor         # [N, Hq, D], uninitialised: the kernels write every row
    ws_acc: torch.Tensor      # split-KV partials (the output itself when there is one split)
    ws_ml: torch.Tensor

    def constexprs(self, num_q_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> dict:
        return dict(NUM_Q_HEADS=num_q_heads, GROUP=self.group, GROUP_PAD=self.group_pad,
                    HEAD_DIM=head_dim, D_PAD=self.d_pad, BLOCK_SIZE=block_size,
                    BLOCK_Q=self.block_q, BLOCK_N=self.block_n, NUM_SPLITS=self.splits,
                    PRECISION="ieee" if dtype == torch.float32 else None,  # fp32: no TF32
                    WHILE_LOOP=interpreting())

    @property
    def num_warps(self) -> int:
        return 4 if self.rows <= 64 else 8


def plan_launch(shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device,
                num_kv_heads: int, num_reqs: int, max_query_len: Optional[int],
                max_seq_len: Optional[int], num_splits: Optional[int]) -> Launch:
    """Tile shape, split count and buffers for attention over queries of ``shape`` [N, Hq, D]."""
    num_tokens, num_q_heads, head_dim = shape
    element_size = dtype.itemsize
    group, group_pad, d_pad, rows, block_n, block_q = launch_shape(
        num_q_heads, num_kv_heads, head_dim, max_query_len, element_size)
    num_tiles = num_tokens // block_q + num_reqs
    splits = num_splits or _choose_splits(num_tiles * num_kv_heads, max_query_len, max_seq_len,
                                          block_q, device)
    out = _new_output(shape, dtype, device)
    if splits > 1:
        ws_acc = torch.empty((splits, num_tokens, num_q_heads, d_pad), dtype=torch.float32,
                             device=device)
        ws_ml = torch.empty((2, splits, num_tokens, num_q_heads), dtype=torch.float32,
                            device=device)
    else:
        ws_acc = ws_ml = out  # unused
    return Launch(group, group_pad, d_pad, rows, block_n, block_q, num_tiles, splits, out, ws_acc,
                  ws_ml)


def merge_splits(launch: Launch, query_start_loc: torch.Tensor, num_reqs: int, head_dim: int,
                 pdl: bool = False) -> None:
    """The split-KV merge into ``launch.out`` (nothing to do for one split); ``pdl``: launched
    ahead of the attention kernel (kernels/triton_pdl.py)."""
    if launch.splits == 1:
        return
    out = launch.out
    num_tokens, num_q_heads = out.shape[0], out.shape[1]
    _merge_splits_kernel[(num_tokens, num_q_heads)](
        launch.ws_acc, launch.ws_ml, out, query_start_loc, num_reqs, num_tokens, out.stride(0),
        out.stride(1), NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, D_PAD=launch.d_pad,
        NUM_SPLITS=launch.splits, PDL=pdl, **triton_pdl.launch_options(pdl))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float, max_query_len: Optional[int] = None,
                    max_seq_len: Optional[int] = None, num_splits: Optional[int] = None) -> torch.Tensor:
    """Ragged causal attention over the paged cache; see the module docstring. -> [N, Hq, D].

    ``num_splits`` (a power of two) overrides the split-KV heuristic (tests use it).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_reqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    if num_tokens == 0 or num_reqs == 0:
        return torch.zeros_like(q, memory_format=torch.contiguous_format)
    launch = plan_launch(q.shape, q.dtype, q.device, num_kv_heads, num_reqs, max_query_len,
                         max_seq_len, num_splits)
    out = launch.out
    pdl = triton_pdl.active(q, "attention")
    _paged_attention_kernel[(launch.num_tiles, num_kv_heads, launch.splits)](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens, launch.ws_acc,
        launch.ws_ml, scale, num_reqs, num_tokens,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), out.stride(0), out.stride(1),
        block_tables.stride(0),
        **launch.constexprs(num_q_heads, head_dim, k_cache.shape[1], q.dtype),
        PDL=pdl, num_warps=launch.num_warps, **triton_pdl.launch_options(pdl),
    )
    merge_splits(launch, query_start_loc, num_reqs, head_dim, pdl)
    return out


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
