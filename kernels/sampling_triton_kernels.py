"""Triton kernels for sampling and rejection sampling (the twins of kernels.ref_sampling).

Work is split over (row, vocabulary chunk) programs, so even one request with few drafts fills
the GPU; each program reads its slice of logits once, in their own dtype, into fp32 registers.
Logits are scaled as ``x = z / T`` with IEEE division, except in rows with T == 1.0 (greedy rows
too), where z / 1.0 == z exactly: each loop is compiled twice, with T and without (``_div_t``),
and a program picks one copy by its row's T.

* ``row_pass_kernel`` (grid [rows, chunks]): per chunk, the softmax partials (max ``m`` of
  ``x = z / T`` and ``s = sum exp(x - m)``) of a sampled row, the greedy partial argmax of
  ``z`` of a greedy row (both for every row without SPLIT) and, where the row needs a sample,
  the partial exponential race ``argmax (x_i - log E_i)``. All are kept per lane (an online
  softmax per lane) and reduced across lanes once per chunk; each loop step loads UNROLL
  tiles at once, so each thread keeps several loads in flight. Rows with top-k / top-p / min-p are done whole by their chunk-0 program: one
  max/sum pass, then multi-way threshold bisection passes (NT candidate thresholds per pass,
  no sort), then the race pass; it writes the kept mass as ``s`` and the threshold to
  ``row_thr``. Races run here where every row needs one (strict verification, draft
  sampling) and, with LAST, in the row of each request without drafts (plain sampling: set
  when no request has drafts, so the call is one pass over each row and no final race kernel).
* ``final_race_kernel`` (grid [requests, chunks], probabilistic only): replays the accept
  tests (all of a request's drafts at once with PARALLEL, else row by row), then works on its
  chunk of the one row that decides the request's last token: the first level of an
  inverse-CDF search (kernels.ref_sampling ``inverse_cdf``), per-tile sums of ``r`` and of the
  weights ``w`` (an exp, a multiply-add and two sums per entry; UNROLL tiles loaded per
  step). After a rejection ``r`` is the residual ``max(w - S q, 0)``; when every draft was
  accepted it is the bonus row's ``w`` itself (no q read). Only that row's logits (and, after
  a rejection, its draft-prob row) are read. A request without drafts in a batch with drafts
  races its row instead (stream SAMPLE, as plain sampling does). So probabilistic
  verification draws random numbers for at most one row per request, and one number for a
  drafting request's last token.
* ``verify_pass_kernel`` (grid [rows x chunks + requests x chunks], 1-D): the two kernels
  above and finalize below in one launch, each race program waiting on a per-request count
  of finished row programs instead of on the kernel boundary, and a request's last race
  program doing its finalize work (``Tuning.fused_race``).
* ``finalize_kernel`` (grid [requests]): greedy / strict acceptance; for a drafting request
  (probabilistic) the second level of the search (the tile sums' running total picks a tile,
  which is recomputed and scanned); a plain row's race winner otherwise; writes the padded
  output row.
* ``draft_finish_kernel`` (grid [requests, chunks]): the draft token and, if asked, q.

``PDL`` (every kernel): launched while the kernel before it runs; it waits for that kernel
before its first load or store (kernels/triton_pdl.py, ``Tuning.pdl`` in kernels.triton_sampling).

Random numbers: see kernels.philox (Philox4x32-10 as ``tl.randint4x``, same key mix). The races
draw a tile of BLOCK indices with BLOCK / 4 Philox calls (``_uniform_tile``: index 4c + w is
word w of counter c; the words are interleaved with tl.join / tl.reshape, which costs a few
layout conversions through shared memory per tile); the accept draw is index 0, word 0 of
counter 0; the inverse-CDF draw (a recovery or a bonus token) takes 52 bits from words 0 and 1
of counter 0 (``_uniform52``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from specserve.kernels.jit_keys import settle_cache_keys
from specserve.kernels.triton_pdl import after_producer

NEG_INF = tl.constexpr(float("-inf"))
BIG_IDX = tl.constexpr(2147483647)
ONE_BITS_PLUS_1 = tl.constexpr(0x3F800001)  # one past the bits of 1.0, the largest exp(x - max)
# log2(e) rounded to fp32: the factor tl.exp itself applies before its ex2 on a GPU
LOG2E = tl.constexpr(1.4426950216293334961)


@triton.jit
def _key(seed, pos, stream):
    """The 64-bit Philox key of (seed, pos, stream): the key mix of kernels.philox."""
    c = (pos * 4 + stream).to(tl.uint32)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32) ^ (c * 0x9E3779B1)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ (c * 0x85EBCA77)
    return (k1.to(tl.uint64) << 32) | k0.to(tl.uint64)


@triton.jit
def _bits_to_uniform(r):
    """uint32 -> fp32 in [2**-24, 1 - 2**-24], exactly."""
    return ((r >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23


@triton.jit
def _uniform(seed, pos, stream, offs):
    """U(seed, pos, stream, offs) in (0, 1) for any indices: word offs % 4 of counter offs // 4
    (one Philox call per element; the races use _uniform_tile)."""
    r0, r1, r2, r3 = tl.randint4x(_key(seed, pos, stream), offs // 4)
    w = offs % 4
    r = tl.where(w == 0, r0, tl.where(w == 1, r1, tl.where(w == 2, r2, r3)))
    return _bits_to_uniform(r)


@triton.jit
def _uniform52(seed, pos, stream):
    """kernels.philox ``uniform52``: one fp64 uniform with 52 bits from words 0 and 1 of
    counter 0, in [2**-53, 1 - 2**-53] (the inverse-CDF draw's number)."""
    r0, r1, _r2, _r3 = tl.randint4x(_key(seed, pos, stream), tl.full([], 0, tl.int32))
    bits = (r0 >> 6).to(tl.float64) * 67108864.0 + (r1 >> 6).to(tl.float64)   # 2**26
    return (bits + 0.5) * 2.220446049250313e-16                                  # 2**-52


@triton.jit
def _uniform_tile(seed, pos, stream, start, BLOCK: tl.constexpr):
    """U for the indices start .. start + BLOCK (start a multiple of 4): BLOCK // 4 Philox calls,
    each giving the four consecutive indices 4c .. 4c + 3 (words interleaved in order)."""
    r0, r1, r2, r3 = tl.randint4x(_key(seed, pos, stream), start // 4 + tl.arange(0, BLOCK // 4))
    # join(join(r0, r2), join(r1, r3))[c, i, j] is word 2 i + j of counter c
    r = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK])
    return _bits_to_uniform(r)


@triton.jit
def _log_e(seed, pos, stream, start, BLOCK: tl.constexpr):
    """log(E) with E = -log U over the tile start .. start + BLOCK: the race subtracts it from
    log-weights."""
    return tl.log(-tl.log(_uniform_tile(seed, pos, stream, start, BLOCK)))


@triton.jit
def _exp(x):
    """exp(x) as exp2(x * log2 e), for the softmax sums and weights of every sampling kernel.

    On a GPU this is the same ``ex2.approx`` of the same fp32 product that ``tl.exp`` emits, but
    in its flush-to-zero form: ``tl.exp`` guards every element against a result below 2**-126
    (a compare and two predicated multiplies), which made six instructions of each exp and half
    of the row pass's instructions per logit (sm_90 SASS, 2026-11-28). The results differ only
    where ``tl.exp`` would give a denormal: 0 instead. No sum here can see that (each holds its
    row's or lane's max term, exp(0) = 1, and 2**-126 is far below an fp32 ulp of 1), and no
    draw either (the inverse-CDF draw resolves 2**-52 of a row's mass)."""
    return tl.exp2(x * LOG2E)


@triton.jit
def _div_t(z, T):
    """z / T with IEEE division (as torch does it); T is None for a row whose temperature is
    1.0 (greedy rows included), where z / 1.0 == z exactly and the division, most of a
    streaming pass's per-element instructions, is left out. Kernels test T != 1.0 once per
    program and run one of two compiled copies of their loop (T or None): a test inside the
    loop, once per tile, slowed the T != 1 rows by ~5%."""
    if T is not None:
        z = tl.math.div_rn(z, T)
    return z


@triton.jit
def _load_x(row_ptr, offs, msk, T):
    """x = z / T in fp32 (_div_t); masked lanes get -inf."""
    z = tl.load(row_ptr + offs, mask=msk, other=NEG_INF).to(tl.float32)
    return _div_t(z, T)


@triton.jit
def _scaled(row_ptr, offs, msk, T, mx):
    """(x, e = exp(x - mx)) of a tile; masked lanes get x = -inf, e = 0."""
    x = _load_x(row_ptr, offs, msk, T)
    return x, _exp(x - mx)


@triton.jit
def _lane_best(score, offs, best, idx):
    upd = score > best
    return tl.where(upd, score, best), tl.where(upd, offs, idx)


@triton.jit
def _reduce_best(best, idx):
    """(value, lowest index achieving it) over lanes."""
    b = tl.max(best, 0)
    return b, tl.min(tl.where(best == b, idx, BIG_IDX), 0)


@triton.jit
def _ld(ptr, mask, other, CG: tl.constexpr):
    """tl.load, past the SM's L1 with CG (".cg"): for what another program of the same launch
    wrote (verify_pass_kernel), where L1 may hold a line that another program on this SM
    loaded before the write."""
    if CG:
        return tl.load(ptr, mask=mask, other=other, cache_modifier=".cg")
    else:
        return tl.load(ptr, mask=mask, other=other)


@triton.jit
def _combine_softmax(m_ptr, s_ptr, base, C, CP: tl.constexpr):
    """Row max and sum of exp(x - max) from per-chunk partials."""
    i = tl.arange(0, CP)
    m = tl.load(m_ptr + base + i, mask=i < C, other=NEG_INF)
    s = tl.load(s_ptr + base + i, mask=i < C, other=0.0)
    mx = tl.max(m, 0)
    return mx, tl.sum(tl.where(m == NEG_INF, 0.0, s * _exp(m - mx)), 0)


@triton.jit
def _combine_argmax(v_ptr, i_ptr, base, C, CP: tl.constexpr, CG: tl.constexpr = False):
    """(index, value) of the best per-chunk partial; ties -> lowest index (CG: loads past L1,
    _ld)."""
    i = tl.arange(0, CP)
    v = _ld(v_ptr + base + i, i < C, NEG_INF, CG)
    ix = _ld(i_ptr + base + i, i < C, BIG_IDX, CG)
    b, idx = _reduce_best(v, ix)
    return idx, b


@triton.jit
def _row_meta(cu_ptr, B, row, HAS_CU: tl.constexpr, NB: tl.constexpr):
    """(request, index j within the request, k_b) of a logits row.

    Request b owns rows from cu[b] + b (strictly increasing in b), so the row's request is the
    number of b < B with cu[b] + b <= row, less one: one vector load of cu (NB >= B lanes)
    instead of a binary search's chain of log2(B) dependent loads at every program's start.
    """
    if HAS_CU:
        b = tl.arange(0, NB)
        first = tl.load(cu_ptr + b, mask=b < B, other=0) + b
        req = tl.sum(((first <= row) & (b < B)).to(tl.int32), 0) - 1
        c0 = tl.load(cu_ptr + req)
        k = tl.load(cu_ptr + req + 1) - c0
        j = row - (c0 + req)
    else:
        req = row
        j = row * 0
        k = row * 0
    return req, j, k


@triton.jit
def _lane_softmax(m, s, x):
    """One online-softmax step per lane: m is each lane's running max of x, s its sum of
    exp(x - m). One exp per element: the smaller of (m, x) is shifted by the larger."""
    hi = tl.maximum(m, x)
    d = _exp(tl.minimum(m, x) - tl.where(hi == NEG_INF, 0.0, hi))   # 0 where both are -inf
    return hi, tl.where(x > m, s * d + 1.0, s + d)


@triton.jit
def _reduce_softmax(m, s):
    """(max, sum of exp(x - max)) from per-lane online-softmax state; -inf lanes add 0."""
    mx = tl.max(m, 0)
    return mx, tl.sum(s * _exp(m - tl.where(mx == NEG_INF, 0.0, mx)), 0)


@triton.jit
def _row_max_sum(row_ptr, V: tl.constexpr, T, BLOCK: tl.constexpr):
    """Whole-row max of x and sum of exp(x - max), online per lane, one reduction at the end."""
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m, s = _lane_softmax(m, s, _load_x(row_ptr, offs, offs < V, T))
    return _reduce_softmax(m, s)


@triton.jit
def _search(row_ptr, V: tl.constexpr, T, mx, lo, lo_mass, k, target, BY_MASS: tl.constexpr,
            NT: tl.constexpr, SBLOCK: tl.constexpr):
    """Largest threshold t (as fp32 bits, >= lo) with count(e >= t) >= k, or with
    mass(e >= t) >= target when BY_MASS. Each pass over the row tests NT candidates inside the
    bracket [lo, hi); values above the bracket are only tallied, and tiles with no value inside
    it skip the [SBLOCK, NT] comparison, so passes after the first two are mostly streaming.
    Returns (bits, mass of e >= t)."""
    hi = tl.full([], ONE_BITS_PLUS_1, tl.int32)
    jn = tl.arange(0, NT)
    while hi - lo > 1:
        span = (hi - lo).to(tl.int64)
        cand = lo + ((span * (jn + 1)) // (NT + 1)).to(tl.int32)          # [NT] in [lo, hi)
        cf = cand.to(tl.float32, bitcast=True)
        lo_f = lo.to(tl.float32, bitcast=True)
        hi_f = hi.to(tl.float32, bitcast=True)
        up_cnt = tl.zeros([SBLOCK], tl.int32)                              # e >= hi, per lane
        up_mass = tl.zeros([SBLOCK], tl.float32)
        cnt = tl.zeros([NT], tl.int32)
        mass = tl.zeros([NT], tl.float32)
        for start in range(0, V, SBLOCK):
            offs = start + tl.arange(0, SBLOCK)
            msk = offs < V
            _x, e = _scaled(row_ptr, offs, msk, T, mx)
            e = tl.where(msk, e, -1.0)
            up = e >= hi_f
            up_cnt += up.to(tl.int32)
            up_mass += tl.where(up, e, 0.0)
            inb = (e >= lo_f) & (e < hi_f)
            if tl.max(inb.to(tl.int32), 0) > 0:
                eb = tl.where(inb, e, -1.0)
                ge = eb[:, None] >= cf[None, :]                            # [SBLOCK, NT]
                cnt += tl.sum(ge.to(tl.int32), 0)
                mass += tl.sum(tl.where(ge, eb[:, None], 0.0), 0)
        cnt = cnt + tl.sum(up_cnt, 0)
        mass = mass + tl.sum(up_mass, 0)
        if BY_MASS:
            ok = mass >= target
        else:
            ok = cnt >= k
        new_lo = tl.max(tl.where(ok, cand, lo), 0)
        new_mass = tl.max(tl.where(ok & (cand == new_lo), mass, -1.0), 0)
        lo_mass = tl.where(new_lo > lo, new_mass, lo_mass)
        hi = tl.min(tl.where(ok, hi, cand), 0)
        lo = new_lo
    return lo, lo_mass


@triton.jit
def _mass_above(row_ptr, V: tl.constexpr, T, mx, thr, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        _x, e = _scaled(row_ptr, offs, offs < V, T, mx)
        acc += tl.where(e >= thr, e, 0.0)
    return tl.sum(acc, 0)


@triton.jit
def _filtered_row(row_ptr, V: tl.constexpr, T, top_k, top_p, min_p, k_on, p_on, m_on,
                  BLOCK: tl.constexpr, NT: tl.constexpr, SBLOCK: tl.constexpr):
    """(max x, threshold on e, kept mass) of a row with top-k / top-p / min-p."""
    mx, s0 = _row_max_sum(row_ptr, V, T, BLOCK)
    bits = tl.full([], 0, tl.int32)
    mass = s0
    if k_on:
        bits, mass = _search(row_ptr, V, T, mx, bits, mass, top_k, 0.0, False, NT, SBLOCK)
    if p_on:
        bits, mass = _search(row_ptr, V, T, mx, bits, mass, 0, top_p * mass, True, NT, SBLOCK)
    thr = bits.to(tl.float32, bitcast=True)
    if m_on:
        if min_p > thr:
            thr = min_p
            mass = _mass_above(row_ptr, V, T, mx, thr, BLOCK)
    return mx, thr, mass


@triton.jit
def _filtered_pass(row_ptr, V: tl.constexpr, T, top_k, top_p, min_p, k_on, p_on, m_on, need_race,
                   seed, pos, stream, BLOCK: tl.constexpr, NT: tl.constexpr,
                   SBLOCK: tl.constexpr):
    """A filtered row, whole: (max x, threshold, kept mass, race best, race index)."""
    m, thr, s = _filtered_row(row_ptr, V, T, top_k, top_p, min_p, k_on, p_on, m_on, BLOCK, NT,
                              SBLOCK)
    r_v = tl.full([], NEG_INF, tl.float32)
    r_i = tl.full([], BIG_IDX, tl.int32)
    if need_race:
        r_v, r_i = _race_range(row_ptr, 0, V, T, m, thr, seed, pos, stream, BLOCK)
    return m, thr, s, r_v, r_i


@triton.jit
def _race_range(row_ptr, lo: tl.constexpr, hi: tl.constexpr, T, mx, thr, seed, pos, stream, BLOCK: tl.constexpr):
    """Race over [lo, hi) of kept tokens (e >= thr): (best score, index)."""
    best = tl.full([BLOCK], NEG_INF, tl.float32)
    idx = lo + tl.arange(0, BLOCK)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x, e = _scaled(row_ptr, offs, offs < hi, T, mx)
        keep = e >= thr
        if tl.max(keep.to(tl.int32), 0) > 0:           # no random numbers for filtered tiles
            sc = tl.where(keep, x - _log_e(seed, pos, stream, start, BLOCK), NEG_INF)
            best, idx = _lane_best(sc, offs, best, idx)
    return _reduce_best(best, idx)


@triton.jit
def _tile_best(score, offs, best, idx):
    """Fold a [UNROLL, BLOCK] tile into per-lane (best, index): the tile's best per lane (lowest
    index on ties), taken only if strictly better, so earlier tiles win ties."""
    tb = tl.max(score, 0)
    ti = tl.min(tl.where(score == tb[None, :], offs, BIG_IDX), 0)
    return _lane_best(tb, ti, best, idx)


@triton.jit
def _tile_softmax(m, s, x, UNROLL: tl.constexpr):
    """Fold a [UNROLL, BLOCK] tile of x into per-lane online-softmax state: UNROLL + 1 exps per
    lane (one per element for UNROLL == 1, as _lane_softmax)."""
    if UNROLL == 1:
        return _lane_softmax(m, s, tl.max(x, 0))
    hi = tl.maximum(m, tl.max(x, 0))
    hs = tl.where(hi == NEG_INF, 0.0, hi)
    return hi, s * _exp(m - hs) + tl.sum(_exp(x - hs[None, :]), 0)


@triton.jit
def _chunk_pass(row_ptr, lo, hi, TILES: tl.constexpr, T, seed, pos, stream, need_race,
                DO_G: tl.constexpr, DO_S: tl.constexpr, BLOCK: tl.constexpr,
                UNROLL: tl.constexpr, PREFETCH: tl.constexpr = False):
    """Unfiltered chunk [lo, hi): softmax partials (DO_S), greedy partial argmax (DO_G),
    optional race partial (DO_S rows only).

    Each of the TILES steps loads UNROLL consecutive tiles as one [UNROLL, BLOCK] block, so
    every thread has UNROLL loads in flight (one per tile was latency-bound: too few bytes in
    flight per SM at the occupancy the registers allow). PREFETCH: each step first issues the
    next step's loads, then works on the block loaded one step before, so a thread's loads stay
    in flight while it computes (the same values in the same order: only the loads move).
    Everything is per lane (online softmax, best score and index); the cross-lane reductions
    run once, after the last step."""
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    lane = tl.arange(0, BLOCK)
    g_best = tl.full([BLOCK], NEG_INF, tl.float32)
    g_idx = lo + lane
    r_best = tl.full([BLOCK], NEG_INF, tl.float32)
    r_idx = lo + lane
    block = tl.arange(0, UNROLL)[:, None] * BLOCK + lane[None, :]   # [UNROLL, BLOCK] offsets
    if PREFETCH:
        raw = tl.load(row_ptr + lo + block, mask=lo + block < hi, other=NEG_INF)
    for t in range(0, TILES):
        start = lo + t * (UNROLL * BLOCK)
        if start < hi:                     # TILES bounds the loop; the last chunk is shorter
            offs = start + block
            if PREFETCH:
                ahead = offs + UNROLL * BLOCK
                z = raw.to(tl.float32)
                raw = tl.load(row_ptr + ahead, mask=ahead < hi, other=NEG_INF)
            else:
                z = tl.load(row_ptr + offs, mask=offs < hi, other=NEG_INF).to(tl.float32)
            if DO_G:
                g_best, g_idx = _tile_best(z, offs, g_best, g_idx)
            if DO_S:
                x = _div_t(z, T)
                m, s = _tile_softmax(m, s, x, UNROLL)
                if need_race:
                    le = tl.reshape(_log_e(seed, pos, stream, start, UNROLL * BLOCK),
                                    [UNROLL, BLOCK])
                    r_best, r_idx = _tile_best(x - le, offs, r_best, r_idx)
    m, s = _reduce_softmax(m, s)
    g_v, g_i = _reduce_best(g_best, g_idx)
    r_v, r_i = _reduce_best(r_best, r_idx)
    return m, s, g_v, g_i, r_v, r_i


@triton.jit(do_not_specialize=["C", "B"])
def row_pass_kernel(logits_ptr, stride, V: tl.constexpr, chunk, C, cu_ptr, B,
                    temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, pos_ptr,
                    part_m, part_s, part_rv, part_ri, part_gv, part_gi, row_thr,
                    stream, HAS_CU: tl.constexpr, RACE: tl.constexpr, LAST: tl.constexpr,
                    NB: tl.constexpr, BLOCK: tl.constexpr, NT: tl.constexpr,
                    SBLOCK: tl.constexpr, TILES: tl.constexpr, UNROLL: tl.constexpr,
                    SPLIT: tl.constexpr, PDL: tl.constexpr = False,
                    PREFETCH: tl.constexpr = False):
    """Grid [rows, C chunks]: chunk c covers [c * chunk, (c + 1) * chunk) of the vocabulary
    (chunk a multiple of BLOCK, at most TILES steps of UNROLL tiles: TILES bounds the loop at
    compile time). SPLIT: a greedy row computes only its argmax (its m, s are placeholders:
    max z and 1) and a sampled row only its softmax (and race): nothing reads the other
    partials of such rows; without SPLIT every unfiltered row computes both. RACE: every
    sampled row races; LAST: the row of each request without drafts races (plain sampling; the
    same race final_race_kernel would run on it)."""
    after_producer(PDL)
    _row_program(tl.program_id(0), tl.program_id(1), logits_ptr, stride, V, chunk, C, cu_ptr, B,
                 temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, pos_ptr, part_m, part_s,
                 part_rv, part_ri, part_gv, part_gi, row_thr, stream, HAS_CU, RACE, LAST, NB,
                 BLOCK, NT, SBLOCK, TILES, UNROLL, SPLIT, PREFETCH)


@triton.jit
def _row_program(row, c, logits_ptr, stride, V: tl.constexpr, chunk, C, cu_ptr, B,
                 temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, pos_ptr,
                 part_m, part_s, part_rv, part_ri, part_gv, part_gi, row_thr,
                 stream, HAS_CU: tl.constexpr, RACE: tl.constexpr, LAST: tl.constexpr,
                 NB: tl.constexpr, BLOCK: tl.constexpr, NT: tl.constexpr,
                 SBLOCK: tl.constexpr, TILES: tl.constexpr, UNROLL: tl.constexpr,
                 SPLIT: tl.constexpr, PREFETCH: tl.constexpr):
    """Row pass program (row, c) (row_pass_kernel's docstring); returns the row's request."""
    req, j, k_b = _row_meta(cu_ptr, B, row, HAS_CU, NB)
    T = tl.load(temp_ptr + req)
    top_k = tl.load(topk_ptr + req)
    top_p = tl.load(topp_ptr + req)
    min_p = tl.load(minp_ptr + req)
    seed = tl.load(seed_ptr + req)
    pos = tl.load(pos_ptr + req) + j
    sampled = T != 0.0
    T_in = T
    T = tl.where(sampled, T, 1.0)
    k_on = (top_k > 0) & (top_k < V) & sampled
    p_on = (top_p < 1.0) & sampled
    m_on = (min_p > 0.0) & sampled
    need_race = sampled & RACE
    if LAST:
        need_race = need_race | (sampled & (k_b == 0))
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    out = row * C + c
    if k_on | p_on | m_on:
        m = tl.full([], NEG_INF, tl.float32)
        s = tl.full([], 0.0, tl.float32)
        r_v = tl.full([], NEG_INF, tl.float32)
        r_i = tl.full([], BIG_IDX, tl.int32)
        if c == 0:
            if T != 1.0:
                m, thr, s, r_v, r_i = _filtered_pass(row_ptr, V, T, top_k, top_p, min_p, k_on,
                                                     p_on, m_on, need_race, seed, pos, stream,
                                                     BLOCK, NT, SBLOCK)
            else:
                m, thr, s, r_v, r_i = _filtered_pass(row_ptr, V, None, top_k, top_p, min_p, k_on,
                                                     p_on, m_on, need_race, seed, pos, stream,
                                                     BLOCK, NT, SBLOCK)
            tl.store(row_thr + row, thr)
        g_v = tl.full([], NEG_INF, tl.float32)
        g_i = tl.full([], BIG_IDX, tl.int32)
    else:
        lo = c * chunk
        hi = tl.minimum(lo + chunk, V)
        if SPLIT & (T_in == 0.0):          # greedy: argmax only (T is now 1)
            m, s, g_v, g_i, r_v, r_i = _chunk_pass(row_ptr, lo, hi, TILES, None, seed, pos,
                                                   stream, False, True, False, BLOCK, UNROLL,
                                                   PREFETCH)
            m = g_v
            s = tl.full([], 1.0, tl.float32)
        elif T != 1.0:
            m, s, g_v, g_i, r_v, r_i = _chunk_pass(row_ptr, lo, hi, TILES, T, seed, pos,
                                                   stream, need_race, not SPLIT, True, BLOCK,
                                                   UNROLL, PREFETCH)
        else:
            m, s, g_v, g_i, r_v, r_i = _chunk_pass(row_ptr, lo, hi, TILES, None, seed, pos,
                                                   stream, need_race, not SPLIT, True, BLOCK,
                                                   UNROLL, PREFETCH)
        if c == 0:
            tl.store(row_thr + row, 0.0)
    tl.store(part_m + out, m)
    tl.store(part_s + out, s)
    tl.store(part_rv + out, r_v)
    tl.store(part_ri + out, r_i)
    tl.store(part_gv + out, g_v)
    tl.store(part_gi + out, g_i)
    return req


@triton.jit
def _accept_count(logits_ptr, stride, C, c0, row0, k_b, T, seed, pos0, drafts_ptr, q_ptr, V,
                  part_m, part_s, row_thr, HAS_Q: tl.constexpr, CP: tl.constexpr):
    """Probabilistic test, row by row: accept x_j iff U(ACCEPT) * q_j(x_j) < p_j(x_j)."""
    n = tl.full([], 0, tl.int32)
    go = k_b > 0
    while go:
        row = row0 + n
        mx, S = _combine_softmax(part_m, part_s, row * C, C, CP)
        thr = tl.load(row_thr + row)
        xj = tl.load(drafts_ptr + c0 + n)
        z = tl.load(logits_ptr + row.to(tl.int64) * stride + xj).to(tl.float32)
        if T != 1.0:                         # a scalar per row: no need for two copies
            z = tl.math.div_rn(z, T)
        e = _exp(z - mx)
        px = tl.where(e >= thr, tl.math.div_rn(e, S), 0.0)
        if HAS_Q:
            qx = tl.load(q_ptr + (c0 + n).to(tl.int64) * V + xj)
        else:
            qx = 1.0
        u = _uniform(seed, pos0 + n, 2, tl.full([], 0, tl.int32))      # index 0: word 0
        ok = (u * qx < px) & (qx > 0.0)      # q(x) == 0 is a caller bug: reject
        n = n + ok.to(tl.int32)
        go = ok & (n < k_b)
    return n


@triton.jit
def _accept_all(logits_ptr, stride, C, c0, row0, k_b, T, seed, pos0, drafts_ptr, q_ptr, V,
                part_m, part_s, row_thr, HAS_Q: tl.constexpr, CP: tl.constexpr,
                KP: tl.constexpr, CG: tl.constexpr = False, xjv=0, EARLY: tl.constexpr = False):
    """The same tests as _accept_count, all k_b at once (lanes j < KP, KP > k_b): no chain of
    dependent loads per draft. Returns (n accepted, and the max, sum and threshold of row n,
    the raced row). CG: the partials are loaded past L1 (_ld; they were written in the same
    launch). EARLY: the draft tokens ``xjv`` were loaded by the caller (_race_inputs)."""
    j = tl.arange(0, KP)
    has_row = j <= k_b
    live = j < k_b
    rows = row0 + j
    i = tl.arange(0, CP)
    pm = has_row[:, None] & (i[None, :] < C)
    m = _ld(part_m + rows[:, None] * C + i[None, :], pm, NEG_INF, CG)             # [KP, CP]
    s = _ld(part_s + rows[:, None] * C + i[None, :], pm, 0.0, CG)
    mx = tl.max(m, 1)
    mxs = tl.where(mx == NEG_INF, 0.0, mx)                               # rows past k_b
    S = tl.sum(tl.where(m == NEG_INF, 0.0, s * _exp(m - mxs[:, None])), 1)
    thr = _ld(row_thr + rows, has_row, 0.0, CG)
    if EARLY:
        xj = xjv
    else:
        xj = tl.load(drafts_ptr + c0 + j, mask=live, other=0)
    z = tl.load(logits_ptr + rows.to(tl.int64) * stride + xj, mask=live, other=0.0).to(tl.float32)
    if T != 1.0:
        z = tl.math.div_rn(z, T)
    e = _exp(z - tl.where(live, mx, 0.0))
    px = tl.where(e >= thr, tl.math.div_rn(e, tl.where(live, S, 1.0)), 0.0)
    if HAS_Q:
        qx = tl.load(q_ptr + (c0 + j).to(tl.int64) * V + xj, mask=live, other=0.0)
    else:
        qx = tl.full([KP], 1.0, tl.float32)
    u = _uniform(seed, pos0 + j, 2, tl.zeros([KP], tl.int32))          # index 0: word 0
    ok = (u * qx < px) & (qx > 0.0) & live   # q(x) == 0 is a caller bug: reject
    n = tl.min(tl.where(ok, KP, j), 0)       # the first test that fails (k_b: none did)
    sel = j == n
    return (n, tl.max(tl.where(sel, mx, NEG_INF), 0), tl.sum(tl.where(sel, S, 0.0), 0),
            tl.sum(tl.where(sel, thr, 0.0), 0))


@triton.jit
def _plain_race_chunk(row_ptr, lo, hi, T, mx, thr, seed, pos, BLOCK: tl.constexpr,
                      TILES: tl.constexpr):
    """The race over [lo, hi) of the row of a request without drafts (stream SAMPLE, x-space, as
    the row pass races): (best score, index); tiles of a filtered row without a kept entry draw
    no random numbers."""
    best = tl.full([BLOCK], NEG_INF, tl.float32)
    idx = lo + tl.arange(0, BLOCK)
    for t in range(0, TILES):
        start = lo + t * BLOCK
        if start < hi:
            offs = start + tl.arange(0, BLOCK)
            x, e = _scaled(row_ptr, offs, offs < hi, T, mx)
            keep = e >= thr
            run = thr <= 0.0                  # an unfiltered row races every tile
            if thr > 0.0:
                run = tl.max(keep.to(tl.int32), 0) > 0
            if run:
                sc = tl.where(keep, x - _log_e(seed, pos, 0, start, BLOCK), NEG_INF)
                best, idx = _lane_best(sc, offs, best, idx)
    return _reduce_best(best, idx)


@triton.jit
def _residual_tile(row_ptr, q_row, offs, msk, xj, T, mx, S, thr, HAS_Q: tl.constexpr):
    """(w, r) over one tile of the deciding row: the kept softmax weights ``w = exp(x - mx)``
    (p = w / S) and, for a rejected draft ``xj``, the residual ``r = max(w - S q, 0)``
    (S max(p - q, 0); kernels.ref_sampling ``_residual``); for a bonus row (``xj < 0``, no
    draft: q is not read) ``r = w``. The search in finalize_kernel recomputes one tile with
    these same ops."""
    _x, e = _scaled(row_ptr, offs, msk, T, mx)
    w = tl.where(e >= thr, e, 0.0)
    if HAS_Q:
        qv = tl.load(q_row + offs, mask=msk & (xj >= 0), other=0.0)
    else:
        qv = tl.where(offs == xj, 1.0, 0.0)
    return w, tl.maximum(w - S * qv, 0.0)


@triton.jit
def _residual_chunk(row_ptr, q_row, lo, hi, xj, T, mx, S, thr, sums_r, sums_w,
                    HAS_Q: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr,
                    UNROLL: tl.constexpr):
    """Per-tile sums (fp64) of the residual and of the weights over [lo, hi) (lo a multiple of
    BLOCK), stored at tile index start // BLOCK: the first level of the inverse-CDF search. UNROLL
    tiles are loaded per step ([UNROLL, BLOCK], summed along the tile), so a program keeps
    several loads in flight: the pass has too little arithmetic to hide one tile's latency."""
    tiles = tl.arange(0, UNROLL)
    for t in range(0, TILES, UNROLL):
        start = lo + t * BLOCK
        if start < hi:
            offs = start + tiles[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
            w, r = _residual_tile(row_ptr, q_row, offs, offs < hi, xj, T, mx, S, thr, HAS_Q)
            live = start + tiles * BLOCK < hi
            rs = tl.sum(r.to(tl.float64), 1)
            if xj < 0:   # a bonus row: r == w (one fp64 conversion per entry, not two: sm_90
                ws = rs  # converts 16 a clock per SM, about the rate a bf16 row streams at)
            else:
                ws = tl.sum(w.to(tl.float64), 1)
            tl.store(sums_r + start // BLOCK + tiles, rs, mask=live)
            tl.store(sums_w + start // BLOCK + tiles, ws, mask=live)


@triton.jit(do_not_specialize=["C", "CR"])
def final_race_kernel(logits_ptr, stride, V: tl.constexpr, chunk, C, CR, cu_ptr,
                      drafts_ptr, q_ptr, temp_ptr, seed_ptr, pos_ptr, part_m, part_s, row_thr,
                      rec_v, rec_i, n_acc_ptr, row_stat, tile_sums,
                      HAS_Q: tl.constexpr, CP: tl.constexpr, TP: tl.constexpr,
                      BLOCK: tl.constexpr, TILES: tl.constexpr, KP: tl.constexpr,
                      PARALLEL: tl.constexpr, UNROLL: tl.constexpr, PDL: tl.constexpr = False):
    """Probabilistic verification, grid [requests, CR chunks]: count the accepted drafts (all
    tests at once with PARALLEL, else one draft after another), then, over this chunk, the
    first level of the last token's inverse-CDF search: per-tile sums into ``tile_sums``
    [2, requests, TP] of the residual and of the weights after a rejection, or of the bonus
    row's weights (twice) when every draft was accepted. A request without drafts races its
    row instead (into ``rec_v`` / ``rec_i``). Chunk 0 stores the accepted count and the
    deciding row's max, sum and threshold (``row_stat`` [3, requests]) for finalize_kernel."""
    after_producer(PDL)
    _race_program(tl.program_id(0), tl.program_id(1), tl.num_programs(0), logits_ptr, stride, V,
                  chunk, C, CR, cu_ptr, drafts_ptr, q_ptr, temp_ptr, seed_ptr, pos_ptr, part_m,
                  part_s, row_thr, rec_v, rec_i, n_acc_ptr, row_stat, tile_sums, HAS_Q, CP, TP,
                  BLOCK, TILES, KP, PARALLEL, UNROLL, False)


@triton.jit
def _race_inputs(b, cu_ptr, temp_ptr, seed_ptr, pos_ptr, drafts_ptr, KP: tl.constexpr):
    """What race program b reads that no program of its launch writes: (temperature, first
    draft index, drafts, seed, first position, the draft tokens [KP]); loaded before a fused
    race program's wait (Tuning.race_early_loads), so they are not on its path after it."""
    T = tl.load(temp_ptr + b)
    c0 = tl.load(cu_ptr + b)
    k_b = tl.load(cu_ptr + b + 1) - c0
    seed = tl.load(seed_ptr + b)
    pos0 = tl.load(pos_ptr + b)
    j = tl.arange(0, KP)
    xjv = tl.load(drafts_ptr + c0 + j, mask=j < k_b, other=0)
    return T, c0, k_b, seed, pos0, xjv


@triton.jit
def _race_program(b, c, nb, logits_ptr, stride, V: tl.constexpr, chunk, C, CR, cu_ptr,
                  drafts_ptr, q_ptr, temp_ptr, seed_ptr, pos_ptr, part_m, part_s, row_thr,
                  rec_v, rec_i, n_acc_ptr, row_stat, tile_sums,
                  HAS_Q: tl.constexpr, CP: tl.constexpr, TP: tl.constexpr,
                  BLOCK: tl.constexpr, TILES: tl.constexpr, KP: tl.constexpr,
                  PARALLEL: tl.constexpr, UNROLL: tl.constexpr, CG: tl.constexpr,
                  EARLY: tl.constexpr = False, inputs=None):
    """Final race program (b, c) of ``nb`` requests (final_race_kernel's docstring); CG: the
    partials are loaded past L1 (_ld; only the parallel tests are fused, so the serial ones
    take no CG). EARLY (parallel tests only): ``inputs`` is what _race_inputs loaded for b."""
    if EARLY:
        T = inputs[0]
    else:
        T = tl.load(temp_ptr + b)
    if T != 0.0:
        if EARLY:
            c0 = inputs[1]
            k_b = inputs[2]
            row0 = c0 + b
            seed = inputs[3]
            pos0 = inputs[4]
        else:   # (this order keeps the instructions of the kernels without EARLY as they were)
            c0 = tl.load(cu_ptr + b)
            k_b = tl.load(cu_ptr + b + 1) - c0
            row0 = c0 + b
            seed = tl.load(seed_ptr + b)
            pos0 = tl.load(pos_ptr + b)
        if PARALLEL:
            if EARLY:
                xjv = inputs[5]
            else:
                xjv = 0   # (not read: _accept_all loads the drafts itself)
            n, mx, S, thr = _accept_all(logits_ptr, stride, C, c0, row0, k_b, T, seed, pos0,
                                        drafts_ptr, q_ptr, V, part_m, part_s, row_thr, HAS_Q,
                                        CP, KP, CG, xjv, EARLY)
        else:
            n = _accept_count(logits_ptr, stride, C, c0, row0, k_b, T, seed, pos0, drafts_ptr,
                              q_ptr, V, part_m, part_s, row_thr, HAS_Q, CP)
            mx, S = _combine_softmax(part_m, part_s, (row0 + n) * C, C, CP)
            thr = tl.load(row_thr + row0 + n)
        if c == 0:
            tl.store(n_acc_ptr + b, n)
            tl.store(row_stat + b, mx)
            tl.store(row_stat + nb + b, S)
            tl.store(row_stat + 2 * nb + b, thr)
        row_ptr = logits_ptr + (row0 + n).to(tl.int64) * stride
        lo = c * chunk
        hi = tl.minimum(lo + chunk, V)
        if k_b > 0:   # a rejected draft's residual, or the bonus row's weights (xj = -1)
            if EARLY and PARALLEL:   # the rejected draft, from the tokens loaded early
                jj = tl.arange(0, KP)
                xj = tl.where(n < k_b, tl.sum(tl.where(jj == n, inputs[5], 0), 0), -1).to(tl.int32)
            else:
                xj = tl.load(drafts_ptr + c0 + n, mask=n < k_b, other=-1).to(tl.int32)
            q_row = q_ptr + (c0 + n).to(tl.int64) * V
            sums_r = tile_sums + b * TP
            sums_w = tile_sums + (nb + b) * TP
            if T != 1.0:
                _residual_chunk(row_ptr, q_row, lo, hi, xj, T, mx, S, thr, sums_r, sums_w,
                                HAS_Q, BLOCK, TILES, UNROLL)
            else:
                _residual_chunk(row_ptr, q_row, lo, hi, xj, None, mx, S, thr, sums_r, sums_w,
                                HAS_Q, BLOCK, TILES, UNROLL)
        else:
            if T != 1.0:
                v, j = _plain_race_chunk(row_ptr, lo, hi, T, mx, thr, seed, pos0 + n, BLOCK, TILES)
            else:
                v, j = _plain_race_chunk(row_ptr, lo, hi, None, mx, thr, seed, pos0 + n, BLOCK, TILES)
            tl.store(rec_v + b * CR + c, v)
            tl.store(rec_i + b * CR + c, j)


@triton.jit(do_not_specialize=["C", "B", "CR", "NROW", "CAP", "W", "NTILES"])
def verify_pass_kernel(logits_ptr, stride, V: tl.constexpr, chunk, C, cu_ptr, B,
                       temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, pos_ptr,
                       part_m, part_s, part_rv, part_ri, part_gv, part_gi, row_thr, stream,
                       race_chunk, CR, drafts_ptr, q_ptr, rec_v, rec_i, n_acc_ptr, row_stat,
                       tile_sums, counts, CAP, NROW, out_ptr, W, NTILES,
                       NB: tl.constexpr, BLOCK: tl.constexpr, NT: tl.constexpr,
                       SBLOCK: tl.constexpr, TILES: tl.constexpr, UNROLL: tl.constexpr,
                       SPLIT: tl.constexpr, PREFETCH: tl.constexpr, HAS_Q: tl.constexpr,
                       CP: tl.constexpr, TP: tl.constexpr, RBLOCK: tl.constexpr,
                       RTILES: tl.constexpr, KP: tl.constexpr, RUNROLL: tl.constexpr,
                       CRP: tl.constexpr, WP: tl.constexpr, PDL: tl.constexpr = False,
                       EARLY: tl.constexpr = False):
    """A probabilistic verification in one launch (grid [NROW + B CR], 1-D): the row pass,
    the final race and finalize. Programs with a ticket (below) under NROW are row pass
    programs (row, chunk), chunk fastest, so a request's rows finish together and early
    requests first; the rest are final race programs (request, chunk), request-major.

    A row program adds one to its request's count ``counts[req]`` once its partials are
    stored (release). A race program waits until its request's count reaches (k_b + 1) C
    (acquire): race programs take the SMs that the row pass's last wave frees, each request's
    as soon as its own rows are done, not after the whole row pass and a kernel boundary. Past
    its work a race program adds one to ``counts[CAP + req]`` (acquire and release); the last
    of a request's CR sets both counts back to zero (every program of the request is past its
    wait: the next launch finds them zero, with no memset) and runs finalize's work for the
    request, which then waits for no other request. What a program reads of what others wrote
    in this launch (partials, the race's sums and counts) it reads past L1 (".cg").

    A program's role comes from a ticket (``counts[2 CAP]``, taken with an atomic add), not
    from its program id: tickets are taken in the order programs start, so every row ticket
    belongs to a program already running when a race program takes its ticket, and a race
    program never waits on a row program that has no SM (whatever order the GPU places a
    grid's programs in). The last ticket's holder sets the ticket back to zero. Under the CPU
    interpreter programs run one after another, so no race program ever waits. The same
    tokens as the separate kernels: the same program bodies, the same partials."""
    after_producer(PDL)
    pid = tl.atomic_add(counts + 2 * CAP, 1, sem="relaxed", scope="gpu")
    if pid == tl.num_programs(0) - 1:      # every program has its ticket
        tl.atomic_xchg(counts + 2 * CAP, 0, sem="relaxed", scope="gpu")
    if pid < NROW:
        row = pid // C
        c = pid - row * C
        req = _row_program(row, c, logits_ptr, stride, V, chunk, C, cu_ptr, B, temp_ptr, topk_ptr,
                           topp_ptr, minp_ptr, seed_ptr, pos_ptr, part_m, part_s, part_rv,
                           part_ri, part_gv, part_gi, row_thr, stream, True, False, False, NB,
                           BLOCK, NT, SBLOCK, TILES, UNROLL, SPLIT, PREFETCH)
        tl.debug_barrier()                 # every thread's stores happen before the arrival
        tl.atomic_add(counts + req, 1, sem="release", scope="gpu")
    else:
        r = pid - NROW
        b = r // CR
        c = r - b * CR
        if EARLY:   # inputs no program of this launch writes: loaded before the wait
            inputs = _race_inputs(b, cu_ptr, temp_ptr, seed_ptr, pos_ptr, drafts_ptr, KP)
            need = (inputs[2] + 1) * C
        else:
            inputs = None
            need = (tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b) + 1) * C
        seen = tl.atomic_add(counts + b, 0, sem="acquire", scope="gpu")
        while seen < need:
            seen = tl.atomic_add(counts + b, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        _race_program(b, c, B, logits_ptr, stride, V, race_chunk, C, CR, cu_ptr, drafts_ptr,
                      q_ptr, temp_ptr, seed_ptr, pos_ptr, part_m, part_s, row_thr, rec_v, rec_i,
                      n_acc_ptr, row_stat, tile_sums, HAS_Q, CP, TP, RBLOCK, RTILES, KP, True,
                      RUNROLL, True, EARLY, inputs)
        tl.debug_barrier()                 # every thread's stores happen before the arrival
        passed = tl.atomic_add(counts + CAP + b, 1, sem="acq_rel", scope="gpu")
        if passed == CR - 1:               # every race program of b is done
            tl.atomic_xchg(counts + b, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counts + CAP + b, 0, sem="relaxed", scope="gpu")
            _finalize_program(b, B, logits_ptr, stride, V, cu_ptr, drafts_ptr, q_ptr, temp_ptr,
                              seed_ptr, pos_ptr, part_rv, part_ri, part_gv, part_gi, rec_v,
                              rec_i, n_acc_ptr, row_stat, tile_sums, out_ptr, W, C, CR, NTILES,
                              False, HAS_Q, CP, CRP, TP, RBLOCK, WP, False, True)


@triton.jit
def _recover(logits_ptr, stride, V: tl.constexpr, q_ptr, drafts_ptr, b, nb, c0, row, n, k_b,
             T, seed, pos, row_stat, tile_sums, NTILES, HAS_Q: tl.constexpr, TP: tl.constexpr,
             BLOCK: tl.constexpr, CG: tl.constexpr = False):
    """The last token of drafting request b, recovered after a rejection (``n < k_b``) or the
    bonus token (kernels.ref_sampling ``inverse_cdf`` / ``recover``): the tile sums' running
    total picks the tile that ``u`` times the total falls in, a running total over that one
    tile (recomputed with the race kernel's ops) picks the entry. Sums, totals and the target are
    fp64, with a 52-bit ``u`` (``_uniform52``), as in the twin. CG: what the final race wrote
    is loaded past L1 (_ld)."""
    mx = _ld(row_stat + b, None, None, CG)
    S = _ld(row_stat + nb + b, None, None, CG)
    thr = _ld(row_stat + 2 * nb + b, None, None, CG)
    i = tl.arange(0, TP)
    live = i < NTILES
    sr = _ld(tile_sums + b * TP + i, live, 0.0, CG)
    sw = _ld(tile_sums + (nb + b) * TP + i, live, 0.0, CG)
    empty = tl.max(sr, 0) <= 0.0                     # no positive residual: fall back to p
    sums = tl.where(empty, sw, sr)
    target = _uniform52(seed, pos, 3) * tl.sum(sums, 0)
    cum = tl.cumsum(sums, 0)
    # the first positive tile whose running total passes the target (not a count of totals at
    # or below it: the scan can leave a zero tile's total an ulp below the one before it)
    t = tl.min(tl.where((cum > target) & (sums > 0.0) & live, i, TP), 0)
    t = tl.where(t == TP, tl.max(tl.where(sums > 0.0, i, 0), 0), t)
    rem = target - tl.sum(tl.where(i == t - 1, cum, 0.0), 0)
    offs = t * BLOCK + tl.arange(0, BLOCK)
    xj = tl.load(drafts_ptr + c0 + n, mask=n < k_b, other=-1).to(tl.int32)
    w, r = _residual_tile(logits_ptr + row.to(tl.int64) * stride,
                          q_ptr + (c0 + n).to(tl.int64) * V, offs, offs < V, xj, T, mx, S, thr,
                          HAS_Q)
    x = tl.where(empty, w, r)
    hit = (tl.cumsum(x.to(tl.float64), 0) > rem) & (x > 0.0)
    first = tl.min(tl.where(hit, offs, BIG_IDX), 0)
    return tl.where(first == BIG_IDX, tl.max(tl.where(x > 0.0, offs, 0), 0), first)


@triton.jit(do_not_specialize=["W", "C", "CR", "NTILES"])
def finalize_kernel(logits_ptr, stride, V: tl.constexpr, cu_ptr, drafts_ptr, q_ptr, temp_ptr,
                    seed_ptr, pos_ptr, part_rv, part_ri, part_gv, part_gi, rec_v, rec_i,
                    n_acc_ptr, row_stat, tile_sums, out_ptr, W, C, CR, NTILES,
                    STRICT: tl.constexpr, HAS_Q: tl.constexpr, CP: tl.constexpr,
                    CRP: tl.constexpr, TP: tl.constexpr, BLOCK: tl.constexpr, WP: tl.constexpr,
                    LAST: tl.constexpr, PDL: tl.constexpr = False):
    """Grid [requests]: greedy / strict acceptance, or (probabilistic) a drafting request's
    recovered or bonus token (the second level of the inverse-CDF search) or a plain row's race
    winner (from the row pass's partials with LAST, else from final_race_kernel's); writes the
    padded output row. A request without drafts reads no accepted count (with LAST no request
    has drafts, and final_race_kernel is not launched)."""
    after_producer(PDL)
    _finalize_program(tl.program_id(0), tl.num_programs(0), logits_ptr, stride, V, cu_ptr,
                      drafts_ptr, q_ptr, temp_ptr, seed_ptr, pos_ptr, part_rv, part_ri, part_gv,
                      part_gi, rec_v, rec_i, n_acc_ptr, row_stat, tile_sums, out_ptr, W, C, CR,
                      NTILES, STRICT, HAS_Q, CP, CRP, TP, BLOCK, WP, LAST, False)


@triton.jit
def _finalize_program(b, nb, logits_ptr, stride, V: tl.constexpr, cu_ptr, drafts_ptr, q_ptr,
                      temp_ptr, seed_ptr, pos_ptr, part_rv, part_ri, part_gv, part_gi, rec_v,
                      rec_i, n_acc_ptr, row_stat, tile_sums, out_ptr, W, C, CR, NTILES,
                      STRICT: tl.constexpr, HAS_Q: tl.constexpr, CP: tl.constexpr,
                      CRP: tl.constexpr, TP: tl.constexpr, BLOCK: tl.constexpr,
                      WP: tl.constexpr, LAST: tl.constexpr, CG: tl.constexpr):
    """Finalize program b of ``nb`` requests (finalize_kernel's docstring); CG: the row pass's
    and the final race's outputs are loaded past L1 (_ld)."""
    T = tl.load(temp_ptr + b)
    greedy = T == 0.0
    c0 = tl.load(cu_ptr + b)
    k_b = tl.load(cu_ptr + b + 1) - c0
    row0 = c0 + b
    if greedy | STRICT:
        # accept while the draft equals the target's argmax (greedy) or own sample (strict)
        n = tl.full([], 0, tl.int32)
        go = k_b > 0
        while go:
            tg, _vg = _combine_argmax(part_gv, part_gi, (row0 + n) * C, C, CP, CG)
            tr, _vr = _combine_argmax(part_rv, part_ri, (row0 + n) * C, C, CP, CG)
            t = tl.where(greedy, tg, tr)
            ok = t.to(tl.int64) == tl.load(drafts_ptr + c0 + n)
            n = n + ok.to(tl.int32)
            go = ok & (n < k_b)
        tg, _vg = _combine_argmax(part_gv, part_gi, (row0 + n) * C, C, CP, CG)
        tr, _vr = _combine_argmax(part_rv, part_ri, (row0 + n) * C, C, CP, CG)
        tok = tl.where(greedy, tg, tr)
    else:
        n = tl.full([], 0, tl.int32)
        if k_b > 0:
            n = _ld(n_acc_ptr + b, None, None, CG)
        if k_b > 0:                                   # recovered (n < k_b) or bonus token
            tok = _recover(logits_ptr, stride, V, q_ptr, drafts_ptr, b, nb, c0,
                           row0 + n, n, k_b, T, tl.load(seed_ptr + b), tl.load(pos_ptr + b) + n,
                           row_stat, tile_sums, NTILES, HAS_Q, TP, BLOCK, CG)
        elif LAST:                                    # a plain row raced in the row pass
            tok, _v = _combine_argmax(part_rv, part_ri, (row0 + n) * C, C, CP, CG)
        else:
            tok, _v = _combine_argmax(rec_v, rec_i, b * CR, CR, CRP, CG)
    cols = tl.arange(0, WP)
    dr = tl.load(drafts_ptr + c0 + cols, mask=cols < n, other=0)
    val = tl.where(cols < n, dr, tl.where(cols == n, tok.to(tl.int64), -1))
    tl.store(out_ptr + b.to(tl.int64) * W + cols, val, mask=cols < W)


@triton.jit
def _store_q(row_ptr, q_row, lo, hi, T, mx, S, thr, greedy, tok, BLOCK: tl.constexpr,
             TILES: tl.constexpr):
    """q over [lo, hi): the filtered probabilities, or one-hot at tok for a greedy row."""
    for t in range(0, TILES):
        if lo + t * BLOCK < hi:
            offs = lo + t * BLOCK + tl.arange(0, BLOCK)
            msk = offs < hi
            _x, e = _scaled(row_ptr, offs, msk, T, mx)
            p = tl.where(e >= thr, tl.math.div_rn(e, S), 0.0)
            q = tl.where(greedy, tl.where(offs == tok, 1.0, 0.0), p)
            tl.store(q_row + offs, q, mask=msk)


@triton.jit(do_not_specialize=["C"])
def draft_finish_kernel(logits_ptr, stride, V: tl.constexpr, chunk, C, temp_ptr, part_m, part_s,
                        part_rv, part_ri, part_gv, part_gi, row_thr, tok_ptr, q_ptr,
                        STORE: tl.constexpr, CP: tl.constexpr, BLOCK: tl.constexpr,
                        TILES: tl.constexpr, PDL: tl.constexpr = False):
    """Grid [requests, C chunks]: request b's draft token (chunk 0 stores it) from the row
    pass's partials and, with STORE, its q over this chunk of the vocabulary."""
    after_producer(PDL)
    b = tl.program_id(0)
    c = tl.program_id(1)
    T = tl.load(temp_ptr + b)
    greedy = T == 0.0
    tg, _vg = _combine_argmax(part_gv, part_gi, b * C, C, CP)
    tr, _vr = _combine_argmax(part_rv, part_ri, b * C, C, CP)
    tok = tl.where(greedy, tg, tr)
    if c == 0:
        tl.store(tok_ptr + b, tok.to(tl.int64))
    if STORE:
        mx, S = _combine_softmax(part_m, part_s, b * C, C, CP)
        thr = tl.load(row_thr + b)
        row_ptr = logits_ptr + b.to(tl.int64) * stride
        q_row = q_ptr + b.to(tl.int64) * V
        lo = c * chunk
        hi = tl.minimum(lo + chunk, V)
        if greedy | (T == 1.0):
            _store_q(row_ptr, q_row, lo, hi, None, mx, S, thr, greedy, tok, BLOCK, TILES)
        else:
            _store_q(row_ptr, q_row, lo, hi, T, mx, S, thr, greedy, tok, BLOCK, TILES)


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
