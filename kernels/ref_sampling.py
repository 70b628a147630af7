"""Plain-PyTorch sampling and rejection sampling: the CPU path and the oracle for the Triton twin.

Semantics (shared with :mod:`kernels.triton_sampling`):

* Distribution of a row with logits ``z`` and the request's ``temperature T, top_k, top_p, min_p``:
  ``T == 0`` is greedy (argmax of ``z``, ties -> lowest index). Otherwise ``x = z / T``,
  ``e = exp(x - max(x))`` (so ``p = e / sum(e)`` is the softmax and ``max(e) == 1``), then

  - top-k: keep ``e >= t_k``, ``t_k`` the k-th largest ``e`` (ties kept; off for ``k <= 0``
    or ``k >= V``);
  - top-p: among those, keep ``e >= t_p`` with ``t_p`` the largest value whose kept mass is at
    least ``top_p`` times the top-k survivors' mass (ties kept; off for ``top_p >= 1``);
  - min-p: keep ``e >= min_p`` (that is ``p >= min_p * max(p)`` after renormalising, because
    ``max(e) == 1``; off for ``min_p <= 0``);
  - renormalise: ``probs = e * keep / sum(e * keep)``.

* Sampling is the exponential race in log space: ``argmax_i (log r_i - log E_i)``,
  ``E_i = -log U(seed, position, stream, i)`` (see :mod:`kernels.philox`). For a filtered
  softmax the log-weights are ``x_i`` on kept tokens (``-inf`` elsewhere), which races exactly
  like ``probs`` itself but needs no normaliser. It serves plain sampling, strict verification
  (its bonus token too) and drafts (stream SAMPLE or DRAFT).

* Probabilistic verification draws a drafting request's last token by inverting a CDF instead
  (one random number with 52 bits, ``u = uniform52(seed, position, RECOVER)``, and the sums in
  fp64, so a token's share of ``u``'s range is its probability down to ~2**-52 of the row's
  mass; with fp32 sums and a 23-bit ``u`` a token below ~1.2e-7 was hit with probability 0
  or 2**-23, whatever its own). With ``w = e * keep`` (so
  ``p = w / S``, ``S = sum(w)``): after a rejection the residual ``r = max(w - S q, 0)``
  (``S max(p - q, 0)``), when every draft was accepted the bonus row's ``r = w``. The token is
  the ``i`` with ``sum(r[:i]) <= u sum(r) < sum(r[:i + 1])``, found in two levels: sums of
  :data:`RECOVER_TILE`-entry tiles pick the tile, a cumulative sum inside it the entry (see
  :func:`inverse_cdf`). A residual without a positive entry falls back to ``w``. Per
  vocabulary entry that is an exp, a multiply-add and two sums: no random number, log or
  division, so the GPU streams the row at memory speed. Exactly one of the recovery and the
  bonus draws at a position, and which one is decided by the accept draws (stream ACCEPT) and
  the drafts (stream DRAFT), so they can share the stream. A request without drafts is plain
  sampling (the race, stream SAMPLE) whatever the rest of its batch does.

No function here synchronises with the device, except that the width of the output of
:func:`rejection_sample` needs the largest per-request draft count: it is read from
``cu_num_draft_tokens`` when that tensor lives on the CPU (free), or taken from the optional
``max_num_draft_tokens`` argument; only if neither is available is it read back from the device.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from specserve.kernels.philox import (
    ACCEPT,
    DRAFT,
    RECOVER,
    SAMPLE,
    neg_log_exponential,
    uniform,
    uniform52,
    uniform_prefix,
)

_RACE_CHUNK_ELEMS = 1 << 20  # rows are raced in blocks of at most this many random numbers
RECOVER_TILE = 1024  # the inverse-CDF search's first level (the Triton twin tiles by its BLOCK:
                     # the tiling changes only the order of fp64 additions)


class RowDist(NamedTuple):
    """The filtered distribution of each row (T == 0 rows get a harmless T = 1 stand-in)."""

    x: torch.Tensor       # [N, V] fp32, z / T
    keep: torch.Tensor    # [N, V] bool, survivors of top-k / top-p / min-p
    weights: torch.Tensor  # [N, V] fp32, exp(x - max x) on keep, 0 elsewhere
    mass: torch.Tensor    # [N, 1] fp32, the sum of weights
    probs: torch.Tensor   # [N, V] fp32, weights / mass
    greedy: torch.Tensor  # [N] bool, T == 0


def _thresholds(e: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                active: torch.Tensor) -> torch.Tensor:
    """Per-row threshold on ``e`` ([N, V], max 1 per row): keep ``e >= thr``. Returns [N, 1]."""
    n, v = e.shape
    k_on = (top_k > 0) & (top_k < v) & active
    p_on = (top_p < 1.0) & active
    m_on = (min_p > 0.0) & active
    t = torch.zeros(n, device=e.device, dtype=torch.float32)
    if e.device.type != "cpu" or bool((k_on | p_on).any()):
        srt = torch.sort(e, dim=1, descending=True).values                   # [N, V]
        kth = srt.gather(1, (top_k.to(torch.int64).clamp(1, v) - 1).unsqueeze(1)).squeeze(1)
        t_k = torch.where(k_on, kth, t)
        srt_k = torch.where(srt >= t_k.unsqueeze(1), srt, 0.0)              # sorted survivors
        mass_k = torch.where(e >= t_k.unsqueeze(1), e, 0.0).sum(dim=1)     # [N]
        cum = torch.cumsum(srt_k, dim=1)                                     # [N, V]
        target = top_p.to(torch.float32) * mass_k
        first = (cum < target.unsqueeze(1)).sum(dim=1)                       # first cum >= target
        last_pos = (srt_k > 0).sum(dim=1) - 1
        first = torch.minimum(first, last_pos).clamp(min=0)
        t_p = srt_k.gather(1, first.unsqueeze(1)).squeeze(1)
        t = torch.where(p_on, torch.maximum(t_p, t_k), t_k)
    t = torch.where(m_on, torch.maximum(t, min_p.to(torch.float32)), t)
    return t.unsqueeze(1)


def row_distribution(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                     top_p: torch.Tensor, min_p: torch.Tensor) -> RowDist:
    """Scaled logits, survivors and renormalised probabilities of each row of ``logits`` [N, V]."""
    z = logits.to(torch.float32)                                           # [N, V]
    temperature = temperature.to(device=z.device, dtype=torch.float32)
    greedy = temperature == 0
    t_safe = torch.where(greedy, torch.ones_like(temperature), temperature)
    x = z / t_safe.unsqueeze(1)                                            # [N, V]
    e = torch.exp(x - x.max(dim=1, keepdim=True).values)                   # [N, V]
    thr = _thresholds(e, top_k.to(z.device), top_p.to(z.device), min_p.to(z.device), ~greedy)
    keep = e >= thr                                                        # [N, V]
    ek = torch.where(keep, e, 0.0)
    mass = ek.sum(dim=1, keepdim=True)
    return RowDist(x, keep, ek, mass, ek / mass, greedy)


def probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
          top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``probs(z, params)`` of every row: [N, V] fp32; a one-hot argmax row where T == 0."""
    d = row_distribution(logits, temperature, top_k, top_p, min_p)
    onehot = _one_hot(greedy_argmax(logits), logits.shape[1])
    return torch.where(d.greedy.unsqueeze(1), onehot, d.probs)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of each row in fp32, ties -> lowest index. [N, V] -> [N] int64."""
    return torch.argmax(logits.to(torch.float32), dim=1)


def all_greedy(temperature: torch.Tensor) -> bool:
    """Whether every row is greedy (T == 0), answered only where that costs no device read:
    ``temperature`` on the CPU. Then the random streams, the filtered softmax and the race are
    skipped; the result is the same as the general path's, whose greedy rows ignore them."""
    return temperature.device.type == "cpu" and bool((temperature == 0).all())


def _one_hot(idx: torch.Tensor, v: int) -> torch.Tensor:
    out = torch.zeros(idx.shape[0], v, device=idx.device, dtype=torch.float32)
    return out.scatter_(1, idx.unsqueeze(1), 1.0)


def _race_scores(score, n: int, v: int, seeds: torch.Tensor, positions: torch.Tensor,
                 stream: int, device: torch.device) -> torch.Tensor:
    """argmax_i score(rows, u)[i] per row, with ``u = U(seed, pos, stream, i)`` drawn for blocks
    of rows (``score(s, u)`` gets the row slice ``s`` and u [rows, V]). Returns [N] int64."""
    rows = max(1, _RACE_CHUNK_ELEMS // max(v, 1))
    out = []
    for s in range(0, n, rows):
        sl = slice(s, s + rows)
        u = uniform_prefix(seeds[sl], positions[sl], stream, v)              # [rows, V]
        out.append(torch.argmax(score(sl, u), dim=1))
    if not out:
        return torch.zeros(0, dtype=torch.int64, device=device)
    return torch.cat(out)


def race(log_weights: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
         stream: int) -> torch.Tensor:
    """Exponential race: ``argmax_i (log_weights_i - log(-log U(seed, pos, stream, i)))``.

    log_weights: [N, V] fp32 (``-inf`` = excluded); seeds, positions: [N]. Returns [N] int64.
    """
    n, v = log_weights.shape
    return _race_scores(lambda sl, u: log_weights[sl] - neg_log_exponential(u), n, v, seeds,
                        positions, stream, log_weights.device)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the index ``i`` with ``sum(w[:i]) <= u sum(w) < sum(w[:i + 1])``; never an entry
    of weight 0. weights: [N, V] fp32 >= 0, each row with a positive entry; u: [N] fp64 in
    (0, 1) (:func:`kernels.philox.uniform52`).

    Two levels, as the Triton twin does it: the tile sums' running total picks the first
    :data:`RECOVER_TILE`-entry tile whose total passes ``u sum(w)``, a running total inside that
    tile picks the entry. Sums and totals are fp64 (the weights are exact in it): an entry's
    share of ``u``'s range is its weight to ~2**-52 of the row's total, and the tiling changes
    only the order of the additions. Where rounding leaves the target past a tile's (or the
    row's) last positive entry, that entry is taken. Returns [N] int64.
    """
    n, v = weights.shape
    nt = -(-v // RECOVER_TILE)
    tiles = torch.nn.functional.pad(weights, (0, nt * RECOVER_TILE - v)).view(n, nt, RECOVER_TILE)
    sums = tiles.sum(dim=2, dtype=torch.float64)                             # [N, nt]
    target = u.to(torch.float64) * sums.sum(dim=1)                           # [N]
    cum = sums.cumsum(dim=1)
    t = _tile_of(sums, cum, target)
    before = torch.where(t > 0, cum.gather(1, (t - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    tile = tiles[torch.arange(n, device=weights.device), t].to(torch.float64)  # [N, TILE]
    hit = (tile.cumsum(dim=1) > (target - before).unsqueeze(1)) & (tile > 0)
    return t * RECOVER_TILE + _first_or_last_positive(hit, tile)


def _tile_of(sums: torch.Tensor, cum: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The tile each row's target falls in: the first tile of positive weight whose running
    total passes it (else the last positive tile). Not a count of the totals at or below the
    target: a parallel scan (the Triton twin's ``tl.cumsum``) can leave a zero tile's running
    total an ulp below the one before, and a count would then land on that tile. [N] int64."""
    return _first_or_last_positive((cum > target.unsqueeze(1)) & (sums > 0), sums)


def _first_or_last_positive(hit: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per row, the first index where ``hit`` (a subset of ``w > 0``), else the last index with
    ``w > 0`` (0 if none). [N] int64."""
    idx = torch.arange(w.shape[1], device=w.device)
    last = torch.where(w > 0, idx, 0).amax(dim=1)
    return torch.where(hit.any(dim=1), hit.to(torch.int8).argmax(dim=1), last)


def recover(weights: torch.Tensor, residual: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The recovered token of each row: :func:`inverse_cdf` over the residual, or over the
    target's weights where the residual is all zero. [N] int64."""
    empty = (residual > 0).any(dim=1, keepdim=True).logical_not()
    return inverse_cdf(torch.where(empty, weights, residual), u)


def _masked_x(d: RowDist, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
    """x with the filtered-out entries at -inf (the races' log-weights), of ``rows`` (all)."""
    return torch.where(d.keep[rows], d.x[rows], float("-inf"))


def sample_draft(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, seeds: torch.Tensor,
                 positions: torch.Tensor, store_probs: bool,
                 probs_out: Optional[torch.Tensor] = None, stream: int = DRAFT
                 ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Sample one draft token per row from ``q = probs(z)`` with ``stream`` (DRAFT).

    logits: [B, V]; temperature/top_p/min_p: [B] f32; top_k: [B] i32; seeds/positions: [B] i64.
    Returns token ids [B] int64 and, if ``store_probs``, q [B, V] fp32 exactly as used (written
    into ``probs_out`` when given).

    ``stream=SAMPLE`` races the draft with the very random numbers the target's own sample at
    that position uses (strict verification): the two samples are coupled, and they agree with
    probability ``sum_i 1 / sum_j max(p_j / p_i, q_j / q_i)`` instead of ``sum_i p_i q_i``.
    """
    dev = logits.device
    g = greedy_argmax(logits)                                                # [B]
    if all_greedy(temperature):
        tok, q = g, (_one_hot(g, logits.shape[1]) if store_probs else None)
    else:
        seeds, positions = seeds.to(dev), positions.to(dev)
        d = row_distribution(logits, temperature, top_k, top_p, min_p)
        tok = torch.where(d.greedy, g, race(_masked_x(d), seeds, positions, stream))
        q = torch.where(d.greedy.unsqueeze(1), _one_hot(g, logits.shape[1]), d.probs) if store_probs else None
    if q is None:
        return tok, None
    if probs_out is not None:
        q = probs_out.copy_(q)
    return tok, q


def _max_drafts(cu: torch.Tensor, max_num_draft_tokens: Optional[int]) -> int:
    if max_num_draft_tokens is not None:
        return int(max_num_draft_tokens)
    if cu.numel() <= 1:
        return 0
    return int((cu[1:] - cu[:-1]).max())  # free on the CPU; a device read-back otherwise


class _Layout(NamedTuple):
    """Where each request's rows and drafts live in the flattened verification batch."""

    k: torch.Tensor          # [B] drafts per request
    row_start: torch.Tensor  # [B] first logits row of each request
    req: torch.Tensor        # [T] request of each row
    j: torch.Tensor          # [T] row index within its request (k_b = bonus row)
    draft_idx: torch.Tensor  # [T] index into draft_token_ids (== sum k for padding)


def _layout(cu: torch.Tensor, num_rows: int) -> _Layout:
    b = cu.numel() - 1
    dev = cu.device
    k = cu[1:] - cu[:-1]
    row_start = cu[:-1] + torch.arange(b, device=dev)
    rows = torch.arange(num_rows, device=dev)
    req = torch.searchsorted(row_start, rows, right=True) - 1
    j = rows - row_start[req]
    return _Layout(k, row_start, req, j, rows - req)


def _accept_rows(method: str, d: RowDist, logits: torch.Tensor, lay: _Layout,
                 x: torch.Tensor, q: Optional[torch.Tensor], seeds_r: torch.Tensor,
                 pos_r: torch.Tensor, sample_tok: Optional[torch.Tensor]) -> torch.Tensor:
    """Whether each row's draft token passes its own test ([T] bool; bonus rows False)."""
    valid = lay.j < lay.k[lay.req]
    greedy_ok = x == greedy_argmax(logits)
    if method == "strict":
        ok = sample_tok == x
    else:
        u = uniform(seeds_r, pos_r, ACCEPT, torch.zeros(1, dtype=torch.int64,
                                                         device=logits.device)).squeeze(1)
        px = d.probs.gather(1, x.unsqueeze(1)).squeeze(1)
        if q is None:
            ok = u < px
        else:
            qx = q.gather(1, x.unsqueeze(1)).squeeze(1)                 # [T]
            bad = valid & ~d.greedy & (qx <= 0)
            if qx.device.type == "cpu":
                if bool(bad.any()):
                    raise ValueError("a draft token has draft probability 0 (draft_probs does "
                                     "not match draft_token_ids)")
            else:
                torch._assert_async(~bad.any(), "draft token with draft probability 0")
            ok = u * qx < px
    return torch.where(d.greedy, greedy_ok, ok) & valid


def rejection_sample(target_logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                     draft_token_ids: torch.Tensor, draft_probs: Optional[torch.Tensor],
                     temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                     method: str, max_num_draft_tokens: Optional[int] = None) -> torch.Tensor:
    """Verify each request's drafts against the target; returns [B, max_k + 1] int64.

    target_logits: [sum k + B, V] (request b owns rows ``cu[b] + b .. cu[b+1] + b``: k_b
    verification rows, then the bonus row; row j has position ``positions[b] + j``);
    cu_num_draft_tokens: [B + 1] i32; draft_token_ids: [sum k] i64; draft_probs: [sum k, V] f32
    or None (drafts were argmax: q is one-hot); per-request params and seeds/positions: [B].
    Output row b: the accepted drafts, exactly one recovered or bonus token, then -1.

    * greedy request (T == 0): accept while x_j == argmax(p_j); emit the argmax of the first
      mismatching row (or of the bonus row).
    * ``probabilistic``: accept iff ``U(ACCEPT, 0) * q_j(x_j) < p_j(x_j)``; at the first rejection
      invert the CDF of ``max(p_j - q_j, 0)`` with ``uniform52(RECOVER)`` (of p_j if that is all
      zero; see :func:`recover`); if all are accepted invert the CDF of the bonus row's p with
      the same ``uniform52(RECOVER)`` (its position is past the last draft's).
    * ``strict``: ``t_j`` = race over p_j with stream SAMPLE; accept iff ``t_j == x_j``, else emit
      ``t_j``; the bonus token is the bonus row's own race. With k_b == 0 every method is plain
      sampling (stream SAMPLE).

    A draft token with ``q_j(x_j) == 0`` is a caller bug: raises ValueError on the CPU (a
    device-side assert elsewhere).
    """
    if method not in ("probabilistic", "strict"):
        raise ValueError(f"unknown rejection method {method!r}")
    dev = target_logits.device
    width = _max_drafts(cu_num_draft_tokens, max_num_draft_tokens) + 1
    cu = cu_num_draft_tokens.to(device=dev, dtype=torch.int64)
    lay = _layout(cu, target_logits.shape[0])
    b = lay.k.numel()
    pad_tok = torch.zeros(1, dtype=torch.int64, device=dev)
    drafts = torch.cat([draft_token_ids.to(device=dev, dtype=torch.int64), pad_tok])  # [sum k + 1]
    x = drafts[lay.draft_idx]                                                   # [T]
    greedy_only = all_greedy(temperature)
    if greedy_only:  # every method reduces to: accept while x_j == argmax(p_j), emit the argmax
        argmax = greedy_argmax(target_logits)                                  # [T]
        ok = (x == argmax) & (lay.j < lay.k[lay.req])
    else:
        seeds, positions = seeds.to(dev), positions.to(dev)
        seeds_r, pos_r = seeds[lay.req], positions[lay.req] + lay.j
        d = row_distribution(target_logits, temperature.to(dev)[lay.req], top_k.to(dev)[lay.req],
                             top_p.to(dev)[lay.req], min_p.to(dev)[lay.req])
        q = None
        if draft_probs is not None and method == "probabilistic":
            q = torch.cat([draft_probs.to(torch.float32),
                           torch.zeros(1, target_logits.shape[1], device=dev)])  # [sum k + 1, V]
        sample_tok = race(_masked_x(d), seeds_r, pos_r, SAMPLE) if method == "strict" else None
        ok = _accept_rows(method, d, target_logits, lay, x, None if q is None else q[lay.draft_idx],
                          seeds_r, pos_r, sample_tok)

    acc = torch.zeros(b, width + 1, dtype=torch.int64, device=dev)            # [B, max_k + 2]
    acc[lay.req, lay.j] = ok.to(torch.int64)
    n_acc = torch.cumprod(acc, dim=1).sum(dim=1)                                # [B]
    sel = lay.row_start + n_acc                                                 # final row
    if greedy_only:
        tok = argmax[sel]
    else:
        tok = _final_tokens(method, d, target_logits, lay, sel, n_acc, x, q, seeds, positions,
                            sample_tok)
    cols = torch.arange(width, device=dev).unsqueeze(0)                          # [1, W]
    didx = (cu[:-1].unsqueeze(1) + cols).clamp(max=drafts.numel() - 1)
    out = torch.where(cols < n_acc.unsqueeze(1), drafts[didx],
                      torch.where(cols == n_acc.unsqueeze(1), tok.unsqueeze(1), -1))
    return out


def _residual(weights: torch.Tensor, mass: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The residual scaled by the mass, ``max(w - S q, 0) = S max(p - q, 0)`` ([B, V]); q one-hot
    at x_j removes x_j from p."""
    return torch.clamp(weights - mass * q, min=0.0)


def _recovered(d: RowDist, sel: torch.Tensor, x: torch.Tensor, q: Optional[torch.Tensor],
               lay: _Layout, seeds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The recovery after a rejection at rows ``sel``: inverse CDF of the residual ([n] int64)."""
    w = d.weights[sel]                                                           # [n, V]
    q_rows = _one_hot(x[sel], w.shape[1]) if q is None else q[lay.draft_idx[sel]]
    return recover(w, _residual(w, d.mass[sel], q_rows), uniform52(seeds, pos, RECOVER))


def _bonus(d: RowDist, sel: torch.Tensor, seeds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The bonus token of drafting requests at rows ``sel`` (every draft accepted): the inverse
    CDF of p with ``uniform52(RECOVER)`` ([n] int64)."""
    return inverse_cdf(d.weights[sel], uniform52(seeds, pos, RECOVER))


def _plain(d: RowDist, sel: torch.Tensor, seeds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The token of requests without drafts at rows ``sel``: the race over p with stream
    SAMPLE, as plain sampling draws it ([n] int64)."""
    return race(_masked_x(d, sel), seeds, pos, SAMPLE)


def _final_tokens(method: str, d: RowDist, logits: torch.Tensor, lay: _Layout, sel: torch.Tensor,
                  n_acc: torch.Tensor, x: torch.Tensor, q: Optional[torch.Tensor],
                  seeds: torch.Tensor, positions: torch.Tensor,
                  sample_tok: Optional[torch.Tensor]) -> torch.Tensor:
    """The one recovered or bonus token of each request ([B] int64)."""
    greedy_tok = greedy_argmax(logits[sel])
    pos = positions + n_acc
    if method == "strict":
        tok = sample_tok[sel]
    else:
        rejected = n_acc < lay.k
        draws = ((rejected, lambda r: _recovered(d, sel[r], x, q, lay, seeds[r], pos[r])),
                 (~rejected & (lay.k > 0), lambda r: _bonus(d, sel[r], seeds[r], pos[r])),
                 (lay.k == 0, lambda r: _plain(d, sel[r], seeds[r], pos[r])))
        if logits.device.type == "cpu":   # a host read is free: each row draws only its own token
            tok = torch.zeros_like(n_acc)
            for which, draw in draws:
                rows = which.nonzero().squeeze(1)
                if rows.numel():
                    tok[rows] = draw(rows)
        else:                             # every row draws all three; each keeps its own
            tok = torch.zeros_like(n_acc)
            for which, draw in draws:
                tok = torch.where(which, draw(slice(None)), tok)
    return torch.where(d.greedy[sel], greedy_tok, tok)


__all__ = ["probs", "row_distribution", "race", "greedy_argmax", "sample_draft",
           "rejection_sample", "SAMPLE", "DRAFT", "ACCEPT", "RECOVER"]
