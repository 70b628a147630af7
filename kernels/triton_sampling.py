"""Triton sampling and rejection sampling: same signatures and semantics as kernels.ref_sampling.

The semantics (distribution, random numbers, acceptance rules) are documented in
:mod:`kernels.ref_sampling` and :mod:`kernels.philox`; the kernels are in
:mod:`kernels.sampling_triton_kernels`. Launches per call: ``sample_draft`` 2,
``rejection_sample`` 3 (probabilistic) or 2 (strict, and plain sampling: no drafts).
Random numbers: strict verification and draft sampling race every row; probabilistic verification
draws a drafting request's last token with one random number, by inverting the CDF of the
residual after a rejection or of the bonus row when every draft was accepted
(kernels.ref_sampling ``inverse_cdf``), and races only the rows of requests without drafts. Each Philox4x32-10
call gives four consecutive vocabulary entries (see kernels.philox), so a V-wide race costs
V / 4 Philox calls. No host synchronisation: the output width of ``rejection_sample`` comes
from ``max_num_draft_tokens`` or a host-side ``cu_num_draft_tokens`` (see
:func:`kernels.ref_sampling.rejection_sample`).

Bytes read per verification step (V-wide rows, logits in their own dtype):
every target row once (all chunks of a row together read it once), plus, for probabilistic
verification, the deciding row's logits again (the rejected or the bonus row; a plain row
unless the row pass raced it: ``Tuning.plain_row_race``) and the rejected row's draft-prob
row (fp32), then one tile of both again (the search's second level); draft-prob rows of
accepted tokens are read at one element each. Top-k / top-p rows
add one read per bisection pass (about 8 per filter with NT = 16; passes after the first two
mostly just stream), done by one program per row: at small batch sizes a filtered row is
latency-bound on one SM (a split-vocabulary bisection would need one launch per pass).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton

from specserve.kernels import sampling_triton_kernels as K
from specserve.kernels import triton_pdl
from specserve.kernels.philox import DRAFT, SAMPLE, draft_stream
from specserve.kernels.ref_sampling import _max_drafts

NT = 16       # candidate thresholds per bisection pass
SBLOCK = 256  # vocabulary tile of a bisection pass ([SBLOCK, NT] comparisons)


@dataclass(frozen=True)
class Tuning:
    """Launch knobs of the sampling kernels (``python -m specserve.bench.rejection_sampler
    --sweep`` times a grid of them on the GPU).

    * ``block``: vocabulary tile; ``unroll``: tiles the row pass loads per loop step (bytes in
      flight per thread: the row pass is a stream, latency-bound at one 16-byte load per thread
      at the occupancy its registers allow);
    * ``row_waves`` / ``race_waves``: programs per SM the row pass / the final race aim for
      (a row is cut into chunks until there are that many);
    * ``row_warps`` / ``race_warps``: warps per program;
    * ``split``: greedy rows compute only their argmax and sampled rows only their softmax
      (without it every row computes both);
    * ``parallel_accept``: the final race's programs run a request's k accept tests at once
      (without it, one after another: a chain of dependent loads per draft, in every program);
    * ``recover_unroll``: tiles a rejection's residual pass loads per loop step;
    * ``plain_row_race``: plain sampling (no request has drafts) races each row in the row
      pass: one pass over each row and no final race kernel. Without it the final race kernel
      reads each row again and races it there: the same random numbers and tokens.
    * ``pdl``: each kernel of the call is launched while the one before it runs and waits for
      it before its first load or store (programmatic dependent launch, kernels/triton_pdl.py;
      only on a GPU that has it): a pass's launch and its programs' start overlap the pass
      before; the wait still ends when that pass has completed.
    * ``prefetch``: the row pass issues each step's loads one step ahead, so they are in flight
      while the thread works on the step before (the same arithmetic in the same order; one
      more block of logits held in registers).
    * ``fused_race``: a probabilistic verification runs its row pass, final race and finalize
      as one launch (``verify_pass_kernel``): race programs take the SMs the row pass's last
      wave frees, a request's as soon as its own rows are done, instead of after the whole row
      pass, and its last race program finalizes it (the same program bodies, partials and
      tokens).
      Needs ``parallel_accept``; calls on one device must not overlap (the engine samples on
      one stream): they share the per-request counts.
    * ``race_whole_steps``: a final race chunk longer than one ``recover_unroll``-tile step is
      cut to a whole number of steps (rounded down, so a row gets more chunks: 17 -> 19 at
      B = 64 on 132 SMs, up to 22 -> 38 at B = 44-50), so its residual pass masks no lanes of
      a step; a row's last chunk and chunks of one step or less can still end mid-step. The
      per-tile sums are stored by tile index and summed within a tile the same way, and the
      plain race keeps the lowest index of the maximum whatever the cut, so the tokens do not
      depend on it. A ``chunk`` passed explicitly is kept as given.
    * ``race_early_loads`` (with ``fused_race``): a race program loads what no program of its
      launch writes (its request's temperature, seed, position, draft span and draft tokens)
      before it waits for the request's rows, not after: fewer dependent loads between the
      wait and its first bulk load. The same values, so the same tokens.

    ``Tuning()`` has every field's default, PDL off; :data:`DEFAULT` turns it on.
    """

    block: int = 1024
    unroll: int = 4
    row_waves: int = 8
    row_warps: int = 4
    race_waves: int = 8
    race_warps: int = 4
    split: bool = True
    parallel_accept: bool = True
    recover_unroll: int = 4
    plain_row_race: bool = True
    pdl: bool = False
    prefetch: bool = False
    fused_race: bool = False
    race_whole_steps: bool = False
    race_early_loads: bool = False

    def __post_init__(self):
        for name in ("block", "unroll", "recover_unroll"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if min(self.row_waves, self.race_waves, self.row_warps, self.race_warps) < 1:
            raise ValueError("waves and warps must be >= 1")

    def races_in_row_pass(self, max_drafts: int) -> bool:
        """Whether a probabilistic verification whose widest request has ``max_drafts`` drafts
        races its rows in the row pass (``plain_row_race``: only plain sampling does)."""
        return self.plain_row_race and max_drafts == 0


# PDL: measured on an H200 (2026-11-28, docs/bench-h200/sampler-pdl: DEFAULT's shape without and
# with it, three runs, medians) it took 0.96x / 0.97x / 0.99x the time at B = 64, k = 3 / 5 / 8
# and 0.99x at B = 256; at B = 1, k = 3 it cost 3 us more (12 -> 15 us), and draft sampling
# (LEGACY's shape) lost at B >= 8 (1.07-1.24x). So the wide verification tuning has it; NARROW
# (under WIDE_ROWS rows) with PDL has not been timed (`--sweep --only narrow,narrow+pdl`).
DEFAULT = Tuning(pdl=True)
# the launch shape and kernel paths before the 2026-11 bandwidth work (the bench's baseline)
LEGACY = Tuning(unroll=1, row_waves=4, race_waves=4, split=False, parallel_accept=False,
                plain_row_race=False)
# LEGACY's launch shape with plain sampling raced in the row pass
NARROW = replace(LEGACY, plain_row_race=True)

# Which tuning a call gets when it names none. Measured on an H100 (2026-11-24, V = 151,936 bf16,
# `python -m specserve.bench.rejection_sampler --sweep`, CUDA-graph replays): the verification
# with DEFAULT takes 0.65-0.74x LEGACY's time at B (k + 1) >= 256 rows (B = 64 and 256), but
# 1.1-1.4x at <= 72 rows (B = 1 and 8), where the row pass is too short to stream; draft
# sampling with DEFAULT is no faster (1.17x at B = 64, 0.98x at B = 256), so it keeps LEGACY.
# Re-measured on an H200 (2026-11-28, DEFAULT with PDL against NARROW, two alternating A/B runs
# of two trees, docs/bench-h200/sampler-exp2): at B = 8 (32, 48 and 72 rows) DEFAULT took
# 0.71-0.85x NARROW's time; at B = 1 (4-9 rows) it was mixed (0.79x at k = 3, 1.35x at k = 8).
# So DEFAULT from 32 rows; 10-31 rows were not measured and keep NARROW. The H100 has not been
# re-measured since PDL and the split loops.
WIDE_ROWS = 32
# Tuning.prefetch, timed on an H200 (2026-11-28, two sweeps of DEFAULT against DEFAULT with
# prefetch in one process, docs/bench-h200/sampler-prefetch): 0.95-0.97x the time at B = 256
# (1,024-2,304 rows, every k of 3, 5, 8, both runs); per run level to 1.10x at B = 64 (256-576
# rows) and 1.01-1.18x at B = 8. So from 1,024 rows only, until the fused launch below.
# Tuning.fused_race with prefetch, timed on an H100 (2026-12-07, docs/bench-h100/fused-race-
# 2026-12-07, the sweep in one process; call 2 the final kernel, call 1 without finalize
# folded in, two runs), against the separate kernels each call would have run before (DEFAULT
# under 1,024 rows, DEFAULT with prefetch from there): 0.97-0.98x the time at B = 64 (k = 3, 5,
# 8: 256-576 rows; 0.94-0.98x in call 1) and 0.93-0.98x at B = 256 (1,024-2,304 rows). Prefetch
# alone lost at B = 64 (1.03-1.07x), and the fused launch without it was level or faster there
# but paid less. At B = 8 (32-72 rows) call 1's fused launch was mixed (1.04-1.24x at k = 3,
# 0.90x at k = 8) and call 2 did not time it, so under 256 rows the kernels stay apart.
FUSED_ROWS = 256
WIDE_FUSED = replace(DEFAULT, fused_race=True, prefetch=True)
DRAFT_TUNING = LEGACY
FINALIZE_WARPS = 4  # finalize_kernel: a recovery scans one BLOCK-entry tile of the rejected row


def verification_tuning(rows: int) -> Tuning:
    """The tuning of a verification over ``rows`` target rows (B (k + 1))."""
    if rows >= FUSED_ROWS:
        return WIDE_FUSED
    return DEFAULT if rows >= WIDE_ROWS else NARROW


@dataclass(frozen=True)
class Plan:
    """Tiling of the vocabulary: BLOCK elements per tile, CHUNK per program, C chunks per row.

    ``chunk`` is a kernel argument (chunks of a row are balanced to within one tile); the
    compile-time loop bounds are ``tiles``, the power of two at or above chunk / block, and
    ``steps`` (the same in steps of ``unroll`` tiles), so the number of compiled variants stays
    small."""

    block: int
    chunk: int
    num_chunks: int
    num_warps: int
    unroll: int = 1

    @property
    def tiles(self) -> int:
        return triton.next_power_of_2(self.chunk // self.block)

    @property
    def steps(self) -> int:
        return triton.cdiv(self.tiles, self.unroll)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (asked once: the query costs ~250 us)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def plan(vocab: int, rows: int, device: torch.device, block: Optional[int] = None,
         chunk: Optional[int] = None, tuning: Tuning = DEFAULT) -> Plan:
    """The row pass's tiling: enough (row, chunk) programs to fill the device (about
    ``tuning.row_waves`` per SM), each chunk as long as it can be; a row's chunks differ by at
    most one tile."""
    return _plan(vocab, rows, device, block, chunk, tuning.block, tuning.row_waves,
                 tuning.row_warps, tuning.unroll)


def race_plan(vocab: int, reqs: int, device: torch.device, block: Optional[int] = None,
              chunk: Optional[int] = None, tuning: Tuning = DEFAULT) -> Plan:
    """The final race's tiling (one raced row per request): about ``tuning.race_waves``
    programs per SM."""
    step = tuning.recover_unroll if tuning.race_whole_steps else 1
    return _plan(vocab, reqs, device, block, chunk, tuning.block, tuning.race_waves,
                 tuning.race_warps, 1, step)


def _plan(vocab: int, rows: int, device: torch.device, block: Optional[int],
          chunk: Optional[int], tuned_block: int, waves: int, warps: int, unroll: int,
          step: int = 1) -> Plan:
    if block is None:
        block = tuned_block if device.type == "cuda" else min(1024, triton.next_power_of_2(vocab))
    if chunk is None:
        tiles_row = triton.cdiv(vocab, block)
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            want = max(1, min(triton.cdiv(waves * _sm_count(index), max(rows, 1)), tiles_row))
        else:
            want = 1
        tiles = triton.cdiv(tiles_row, want)
        if tiles > step:
            tiles -= tiles % step      # whole loop steps (race_whole_steps)
        chunk = tiles * block
    chunk = max(block, triton.cdiv(chunk, block) * block)
    return Plan(block, chunk, triton.cdiv(vocab, chunk), warps * max(1, block // 1024),
                min(unroll, triton.next_power_of_2(chunk // block)))


class _Partials:
    """Per (row, chunk) partial results of row_pass_kernel."""

    def __init__(self, rows: int, num_chunks: int, device: torch.device):
        # two allocations, split into views; each view starts 16-byte aligned (n rounded up to
        # a multiple of 4), as Triton's pointer specialisation expects of a fresh tensor
        n = triton.cdiv(rows * num_chunks, 4) * 4
        f32 = torch.empty(4 * n + max(rows, 1), device=device, dtype=torch.float32)
        self.m, self.s, self.rv, self.gv, self.thr = f32.split([n, n, n, n, max(rows, 1)])
        self.ri, self.gi = torch.empty(2 * n, device=device, dtype=torch.int32).split([n, n])


class _RaceOutputs:
    """What final_race_kernel leaves for finalize_kernel, per request: a plain row's race best
    (score, index) per chunk, the accepted count, the deciding row's (max, sum, threshold) and
    the inverse-CDF search's tile sums [2, requests, TP] (residual or bonus weights, weights;
    fp64). One float, one double and one int allocation, split into views that each start
    16-byte aligned (see _Partials)."""

    def __init__(self, reqs: int, race_chunks: int, tiles_pad: int, device: torch.device):
        nc, ns = _pad4(reqs * race_chunks), _pad4(3 * reqs)
        f32 = torch.empty(nc + ns, device=device, dtype=torch.float32)
        self.rec_v, self.row_stat = f32.split([nc, ns])
        self.tile_sums = torch.empty(2 * reqs * tiles_pad, device=device, dtype=torch.float64)
        self.rec_i, self.n_acc = torch.empty(nc + reqs, device=device,
                                             dtype=torch.int32).split([nc, reqs])


def _pad4(n: int) -> int:
    return triton.cdiv(n, 4) * 4


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` starting 16-byte aligned (copied when it does not). Triton compiles a separate
    variant of a kernel for a pointer argument that is not 16-byte aligned; parameter rows cut
    from one [3, B] tensor are aligned or not depending on B, and each new combination cost a
    multi-second compile mid-traffic (measured on an H100 when a batch shrank from 63 to 62)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _params(dev: torch.device, temperature, top_k, top_p, min_p, seeds, positions):
    return tuple(_aligned(t.to(device=dev, dtype=dtype)) for t, dtype in (
        (temperature, torch.float32), (top_k, torch.int32), (top_p, torch.float32),
        (min_p, torch.float32), (seeds, torch.int64), (positions, torch.int64)))


def _row_pass(logits: torch.Tensor, pl: Plan, cu: torch.Tensor, num_reqs: int, params,
              stream: int, has_cu: bool, race: bool, split: bool,
              last: bool = False, pdl: bool = False, prefetch: bool = False,
              part: Optional[_Partials] = None) -> _Partials:
    rows, vocab = logits.shape
    part = part or _Partials(rows, pl.num_chunks, logits.device)
    K.row_pass_kernel[(rows, pl.num_chunks)](
        logits, logits.stride(0), vocab, pl.chunk, pl.num_chunks, cu, num_reqs, *params,
        part.m, part.s, part.rv, part.ri, part.gv, part.gi, part.thr, stream,
        HAS_CU=has_cu, RACE=race, LAST=last, NB=1 << max(9, num_reqs.bit_length()),
        BLOCK=pl.block, NT=NT, SBLOCK=min(SBLOCK, pl.block), TILES=pl.steps,
        UNROLL=pl.unroll, SPLIT=split, PDL=pdl, PREFETCH=prefetch, num_warps=pl.num_warps,
        **triton_pdl.launch_options(pdl))
    return part


# Per-request counts of verify_pass_kernel: [2, RACE_COUNTS] int32 per device and its program
# ticket after them, zero between launches (each launch sets what it used back to zero),
# allocated once and never replaced, as captured CUDA graphs keep its address (the engine's
# sampler warm-up runs eagerly before any capture, so its graphs get the fused launch). A batch
# of more requests, or a first call inside a graph capture (no allocation there), runs the
# separate kernels instead.
RACE_COUNTS = 8192
_race_count_buffers: dict[tuple[str, int], torch.Tensor] = {}


def _race_counts(dev: torch.device, num_reqs: int) -> Optional[torch.Tensor]:
    if num_reqs > RACE_COUNTS:
        return None
    index = dev.index if dev.index is not None else (
        torch.cuda.current_device() if dev.type == "cuda" else 0)
    key = (dev.type, index)
    counts = _race_count_buffers.get(key)
    if counts is None:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counts = _race_count_buffers[key] = torch.zeros(2 * RACE_COUNTS + 4, dtype=torch.int32,
                                                        device=dev)
    return counts


def _verify_pass(logits: torch.Tensor, pl: Plan, pr: Plan, cu: torch.Tensor,
                 drafts: torch.Tensor, q: torch.Tensor, num_reqs: int, params, part: _Partials,
                 race: "_RaceOutputs", counts: torch.Tensor, has_q: bool, cp: int, tp: int,
                 width: int, tuning: Tuning, pdl: bool, out: torch.Tensor) -> None:
    """verify_pass_kernel: row_pass_kernel's and final_race_kernel's programs in one grid,
    finalize's work in each request's last race program; writes ``out``."""
    rows, vocab = logits.shape
    nrow = rows * pl.num_chunks
    K.verify_pass_kernel[(nrow + num_reqs * pr.num_chunks,)](
        logits, logits.stride(0), vocab, pl.chunk, pl.num_chunks, cu, num_reqs, *params,
        part.m, part.s, part.rv, part.ri, part.gv, part.gi, part.thr, SAMPLE,
        pr.chunk, pr.num_chunks, drafts, q, race.rec_v, race.rec_i, race.n_acc, race.row_stat,
        race.tile_sums, counts, RACE_COUNTS, nrow, out, width, triton.cdiv(vocab, pr.block),
        NB=1 << max(9, num_reqs.bit_length()), BLOCK=pl.block, NT=NT,
        SBLOCK=min(SBLOCK, pl.block), TILES=pl.steps, UNROLL=pl.unroll, SPLIT=tuning.split,
        PREFETCH=tuning.prefetch, HAS_Q=has_q, CP=cp, TP=tp, RBLOCK=pr.block, RTILES=pr.tiles,
        KP=triton.next_power_of_2(width), RUNROLL=min(tuning.recover_unroll, pr.tiles),
        CRP=_chunks_pad(vocab, pr), WP=triton.next_power_of_2(width), PDL=pdl,
        EARLY=tuning.race_early_loads,
        num_warps=FINALIZE_WARPS, **triton_pdl.launch_options(pdl))


def _rowwise(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def _tiles_pad(vocab: int, block: int) -> int:
    """The tiles of a row, padded to a power of two: the width of the recovery's tile sums,
    and the most chunks any plan for this vocabulary can have (one tile each)."""
    return triton.next_power_of_2(triton.cdiv(vocab, block))


def _chunks_pad(vocab: int, pl: Plan) -> int:
    """Width of the per-chunk partials of plan ``pl`` that a combine step reads (lanes past a
    row's chunks are masked): the most chunks a plan with the same loop bound can have, padded
    to a power of two. A plan's chunks hold more than ``pl.tiles // 2`` tiles each (``tiles`` is
    the power of two at or above them), so the width follows the compiled loop bound and adds
    no variant. It was once the vocabulary's tile count (256 at V = 151,936): the accept tests
    then combined [k + 1, 256] partials per program, most of the final race kernel's time at
    k = 8 on an H100 (51 us against 32 us at k = 3, B = 64, every draft rejected)."""
    return triton.next_power_of_2(triton.cdiv(triton.cdiv(vocab, pl.block), pl.tiles // 2 + 1))


def sample_draft(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, seeds: torch.Tensor,
                 positions: torch.Tensor, store_probs: bool, *,
                 probs_out: Optional[torch.Tensor] = None, stream: int = DRAFT,
                 block: Optional[int] = None,
                 chunk: Optional[int] = None,
                 tuning: Optional[Tuning] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Draft tokens [B] int64 (and q [B, V] fp32 if ``store_probs``, in ``probs_out`` when
    given); see ref_sampling."""
    logits = _rowwise(logits)
    b, vocab = logits.shape
    dev = logits.device
    tokens = torch.empty(b, dtype=torch.int64, device=dev)
    q = None
    if store_probs:
        q = torch.empty(b, vocab, dtype=torch.float32, device=dev) if probs_out is None else probs_out
        assert q.shape == (b, vocab) and q.dtype == torch.float32 and q.is_contiguous()
    if b == 0:
        return tokens, q
    tuning = tuning or DRAFT_TUNING
    pl = plan(vocab, b, dev, block, chunk, tuning)
    params = _params(dev, temperature, top_k, top_p, min_p, seeds, positions)
    pdl = tuning.pdl and triton_pdl.usable(logits)
    part = _row_pass(logits, pl, tokens, b, params, stream, has_cu=False, race=True,
                     split=tuning.split, pdl=pdl, prefetch=tuning.prefetch)
    grid = (b, pl.num_chunks if store_probs else 1)
    K.draft_finish_kernel[grid](
        logits, logits.stride(0), vocab, pl.chunk, pl.num_chunks, params[0], part.m, part.s,
        part.rv, part.ri, part.gv, part.gi, part.thr, tokens, q if store_probs else tokens,
        STORE=store_probs, CP=_chunks_pad(vocab, pl), BLOCK=pl.block,
        TILES=pl.tiles, PDL=pdl, num_warps=pl.num_warps, **triton_pdl.launch_options(pdl))
    return tokens, q


def rejection_sample(target_logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                     draft_token_ids: torch.Tensor, draft_probs: Optional[torch.Tensor],
                     temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                     method: str, max_num_draft_tokens: Optional[int] = None, *,
                     block: Optional[int] = None, chunk: Optional[int] = None,
                     tuning: Optional[Tuning] = None) -> torch.Tensor:
    """[B, max_k + 1] int64: accepted drafts, one recovered/bonus token, -1 padding.

    A draft token with draft probability 0 is treated as rejected (the reference raises).
    """
    if method not in ("probabilistic", "strict"):
        raise ValueError(f"unknown rejection method {method!r}")
    logits = _rowwise(target_logits)
    rows, vocab = logits.shape
    dev = logits.device
    width = _max_drafts(cu_num_draft_tokens, max_num_draft_tokens) + 1
    num_reqs = cu_num_draft_tokens.numel() - 1
    out = torch.empty(num_reqs, width, dtype=torch.int64, device=dev)
    if num_reqs == 0:
        return out
    cu = cu_num_draft_tokens.to(device=dev, dtype=torch.int32)
    drafts = draft_token_ids.to(device=dev, dtype=torch.int64)
    if drafts.numel() == 0:
        drafts = torch.zeros(1, dtype=torch.int64, device=dev)
    params = _params(dev, temperature, top_k, top_p, min_p, seeds, positions)
    tuning = tuning or verification_tuning(rows)
    pl = plan(vocab, rows, dev, block, chunk, tuning)
    strict = method == "strict"
    # plain sampling raced in the row pass (the same tokens; Tuning.plain_row_race)
    last = not strict and tuning.races_in_row_pass(width - 1)
    has_q = not strict and draft_probs is not None and draft_probs.numel() > 0
    # any conversion launches before the row pass: the sampler's kernels then follow each
    # other directly (with Tuning.pdl, each launched while the one before runs); without draft
    # probabilities the kernels get the row pass's partials in their place (unread)
    q = draft_probs.to(torch.float32).contiguous() if has_q else None
    pdl = tuning.pdl and triton_pdl.usable(logits)
    part = _Partials(rows, pl.num_chunks, dev)
    pr = race_plan(vocab, num_reqs, dev, block, chunk, tuning)   # the one race per request
    cp, tp = _chunks_pad(vocab, pl), _tiles_pad(vocab, pr.block)
    race = _RaceOutputs(num_reqs, pr.num_chunks, tp, dev)
    q = q if has_q else part.m
    races = not strict and not last   # a final race runs (plain sampling can race in the row pass)
    counts = None
    # (finalize's fp64 sums run at its own warp count, so the fused launch must share it: at
    # another count the sums could round apart from the separate kernel's)
    if (races and tuning.fused_race and tuning.parallel_accept
            and pl.num_warps == pr.num_warps == FINALIZE_WARPS):
        counts = _race_counts(dev, num_reqs)
    if counts is not None:        # the whole verification in one launch
        _verify_pass(logits, pl, pr, cu, drafts, q, num_reqs, params, part, race, counts,
                     has_q, cp, tp, width, tuning, pdl, out)
        return out
    part = _row_pass(logits, pl, cu, num_reqs, params, SAMPLE, has_cu=True, race=strict,
                     split=tuning.split, last=last, pdl=pdl, prefetch=tuning.prefetch, part=part)
    if races:
        K.final_race_kernel[(num_reqs, pr.num_chunks)](
            logits, logits.stride(0), vocab, pr.chunk, pl.num_chunks, pr.num_chunks, cu, drafts,
            q, params[0], params[4], params[5], part.m, part.s, part.thr, race.rec_v,
            race.rec_i, race.n_acc, race.row_stat, race.tile_sums,
            HAS_Q=has_q, CP=cp, TP=tp, BLOCK=pr.block, TILES=pr.tiles,
            KP=triton.next_power_of_2(width), PARALLEL=tuning.parallel_accept,
            UNROLL=min(tuning.recover_unroll, pr.tiles), PDL=pdl, num_warps=pr.num_warps,
            **triton_pdl.launch_options(pdl))
    K.finalize_kernel[(num_reqs,)](
        logits, logits.stride(0), vocab, cu, drafts, q, params[0], params[4], params[5],
        part.rv, part.ri, part.gv, part.gi, race.rec_v, race.rec_i, race.n_acc, race.row_stat,
        race.tile_sums, out, width, pl.num_chunks, pr.num_chunks, triton.cdiv(vocab, pr.block),
        STRICT=strict, HAS_Q=has_q, CP=cp, CRP=_chunks_pad(vocab, pr), TP=tp, BLOCK=pr.block,
        WP=triton.next_power_of_2(width), LAST=last, PDL=pdl, num_warps=FINALIZE_WARPS,
        **triton_pdl.launch_options(pdl))
    return out


def _representative_rows(vocab: int, max_rows: int, device: torch.device) -> list[int]:
    """Row counts that reach every compiled variant: each launch plan's loop bound (TILES is a
    compile-time constant, and the partials' width follows it; the chunk and row counts are not
    specialised), each with a count of 1, a multiple of 16 and anything else (cheap
    insurance against a specialised integer argument)."""
    seen: dict[tuple[int, int], int] = {}
    for r in range(1, max(1, max_rows) + 1):
        kind = 0 if r == 1 else (1 if r % 16 == 0 else 2)
        seen.setdefault((plan(vocab, r, device, tuning=DRAFT_TUNING).tiles, kind), r)
    return sorted(seen.values())


def warm_up_shapes(vocab: int, max_reqs: int, max_drafts: int,
                   device: torch.device) -> tuple[list[int], list[tuple[int, int, int]]]:
    """(draft-sampling row counts, rejection-sampling (requests, target rows, widest k) shapes)
    whose launches reach every variant of the kernels: the tuning and the row pass's loop bound
    over the target rows, the final race's over the requests, the output width over the widest
    k. A batch's requests need not draft alike (near max_tokens a request takes fewer drafts),
    so B requests whose widest has k drafts verify anywhere from B + k to B (k + 1) rows: a
    warm-up of uniform batches only left variants that such a batch compiled mid-traffic (a
    1-2.8 s stall each, H100, 2026-11-26)."""
    def row_key(rows: int) -> tuple:
        t = verification_tuning(rows)   # each tuning compiles variants of its own
        return t, plan(vocab, rows, device, tuning=t).tiles

    max_rows = max(1, max_reqs) * (max_drafts + 1)
    row_keys = [None] + [row_key(r) for r in range(1, max_rows + 1)]
    changes = [r for r in range(2, max_rows + 1) if row_keys[r] != row_keys[r - 1]]
    race = {}
    first: dict[tuple, tuple[int, int, int]] = {}
    for reqs in range(1, max(1, max_reqs) + 1):
        for k in range(max_drafts + 1):
            lo, hi = (reqs, reqs) if k == 0 else (reqs + k, reqs * (k + 1))
            for rows in [lo] + [c for c in changes if lo < c <= hi]:
                t, tiles = row_keys[rows]
                if (reqs, t) not in race:
                    race[(reqs, t)] = race_plan(vocab, reqs, device, tuning=t).tiles
                last = t.races_in_row_pass(k)  # plain sampling's kernel variants
                key = (t, tiles, race[(reqs, t)], triton.next_power_of_2(k + 1), last)
                first.setdefault(key, (reqs, rows, k))
    return _representative_rows(vocab, max_reqs, device), sorted(first.values())


def _ragged_drafts(reqs: int, total: int, widest: int) -> list[int]:
    """Drafts per request: ``total`` over ``reqs`` requests, the first taking ``widest``, none
    more."""
    per, left = [], total
    for i in range(reqs):
        n = min(widest, left)
        per.append(n)
        left -= n
    assert left == 0 and (not per or per[0] == widest), (reqs, total, widest)
    return per


def warm_up(vocab: int, max_reqs: int, max_drafts: int, method: str, with_probs: bool,
            store_probs: bool, dtype: torch.dtype, device: torch.device, part: int = 0,
            parts: int = 1) -> int:
    """Compile the kernel variants a server can meet, so no request waits for Triton's JIT.

    Variants come from the launch plan (row counts), the padded output width (draft counts) and
    the method flags; returns the number of calls made. Compiled kernels land in Triton's
    on-disk cache, so later start-ups are quick. ``part`` of ``parts``: every parts-th call from
    the part-th on (the worker processes of kernels/precompile.py split the calls so).
    """
    if not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts}")
    calls = 0
    gen = torch.Generator(device=device).manual_seed(0)

    def params(n: int):
        f32 = dict(device=device, dtype=torch.float32)
        return (torch.ones(n, **f32), torch.zeros(n, dtype=torch.int32, device=device),
                torch.ones(n, **f32), torch.zeros(n, **f32),
                torch.arange(n, dtype=torch.int64, device=device), torch.zeros(n, dtype=torch.int64, device=device))

    draft_rows, shapes = warm_up_shapes(vocab, max_reqs, max_drafts, device)
    calls_in_order = [("draft", b) for b in draft_rows] + [("verify", s) for s in shapes]
    mine = calls_in_order[part::parts]
    draft_rows = [b for kind, b in mine if kind == "draft"]
    shapes = [s for kind, s in mine if kind == "verify"]
    for b in draft_rows:
        logits = torch.randn(b, vocab, generator=gen, device=device).to(dtype)
        sample_draft(logits, *params(b), store_probs, stream=draft_stream(method))
        calls += 1
    for reqs, rows, k in shapes:
        per = _ragged_drafts(reqs, rows - reqs, k)
        logits = torch.randn(rows, vocab, generator=gen, device=device).to(dtype)
        cu = torch.tensor([0] + per, dtype=torch.int32).cumsum(0).to(device=device, dtype=torch.int32)
        n = rows - reqs
        drafts = torch.zeros(n, dtype=torch.int64, device=device)
        probs = torch.full((n, vocab), 1.0 / vocab, device=device) if with_probs and n else None
        rejection_sample(logits, cu, drafts, probs, *params(reqs), method, k)
        calls += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return calls
