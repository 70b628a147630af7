"""Adaptive speculation: choose k (0..k_max) every step to maximise committed tokens per second.

Plain Python, no torch. Three parts, each fed by numbers the engine already has:

* :class:`AcceptanceModel`: the conditional acceptance rate a_j of draft position j (accepted
  given positions 1..j-1 were), per temperature bucket and generation phase (output tokens so
  far: 0-15, 16-31, 32-63, 64-127, 128-255, 256+) across requests, and per request: means of the outcomes
  (moving averages once there are many) shrunk toward a prior, the position before for a
  bucket's first phase, the phase before for a later one, the bucket's estimate for a request. A verification of n drafts with m
  accepted tries positions 1..min(m + 1, n): the first m succeed, position m + 1 (if drafted)
  fails, later ones were not tried and leave their estimate alone. A bucket's first position
  with few outcomes is read one standard error high (``AcceptanceModel.OPTIMISM``): a cold
  bucket tries drafting instead of waiting for probes, one position deeper at a time.
* :class:`CostModel`: seconds of one decode step at batch B when every request proposes k drafts:
  ``k * c_draft(B) + t_target(B, k + 1) + overhead(B)``. ``c_draft`` and ``t_target`` (sampler
  included) come from a start-up calibration on the device (engine/runner/calibration.py);
  the overhead (host work: scheduling, inputs, bookkeeping) is learnt online as what real steps
  cost beyond the device parts, and every (batch bucket, k) the engine actually runs keeps the
  median of its last measured step times, which replaces the calibrated prediction once it has
  samples (a median: one slow step now and then is no cost of its k).
* :class:`KController`: every step, for the requests that sample, evaluates for k = 0..k_max

      E_r(k) = 1 + sum_{i<=k} prod_{j<=i} a_{r,j},   goodput(k) = sum_r E_r(k) / step(B, k)

  and picks the best (k = 0: plain decoding through the same path). At k = 0 a step at k = 1
  now and then (a probe) keeps the estimates alive: on a doubling schedule, and as often as
  the speed-up drafting could still bring (``expected_gain``) pays for. One k for the whole batch:
  the draft program runs its passes for the batch's largest k and the verification graph is
  padded to the batch's widest row, so a smaller k for one request saves no time and only loses
  its expected tokens (docs/speculation.md). Rows may still take fewer drafts near max_tokens.

Seeded requests at temperature > 0 under probabilistic verification (greedy drafts included)
are pinned to k = 0 in adaptive mode: with min(1, p/q) acceptance the token at a position depends on
whether a draft was verified there, and no shared-randomness scheme can make it independent of
that while keeping sum min(p, q) acceptance; pinned, their output is the plain decoding output
for their seed whatever the load. Greedy requests and strict verification are independent of k
and adapt freely.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

# (name, upper bound of temperature) in order; greedy is temperature 0
TEMPERATURE_BUCKETS = (("greedy", 0.0), ("t<0.5", 0.5), ("t<1.2", 1.2), ("t>=1.2", math.inf))


def temperature_bucket(temperature: float) -> int:
    if temperature <= 0.0:
        return 0
    for i, (_, bound) in enumerate(TEMPERATURE_BUCKETS[1:], start=1):
        if temperature < bound:
            return i
    return len(TEMPERATURE_BUCKETS) - 1


def expected_tokens_table(rates: list[float]) -> list[float]:
    """[E(0), E(1), ..., E(len(rates))] in one pass (E as in :func:`expected_tokens`)."""
    out, e, run = [1.0], 1.0, 1.0
    for a in rates:
        run *= a
        e += run
        out.append(e)
    return out


def expected_gain(mean: float, weight: float, seconds: list[float], margin: float = 1.0,
                  points: int = 32) -> float:
    """The expected relative speed-up over k = 0 of drafting at the best k, when every
    position's acceptance is one rate A read as ``mean`` from ``weight`` outcomes (its prior's
    weight included) and a step at k takes ``seconds[k]``: E[max(0, max_k E_k(A) s_0 / (s_k
    margin) - 1)] for A ~ N(mean, mean (1 - mean) / (weight + 1)) (a Beta's mean and variance)
    cut to [0, 1] and to four standard deviations, by the midpoint rule over ``points`` rates."""
    def gain(a: float) -> float:
        table = expected_tokens_table([a] * (len(seconds) - 1))
        return max([table[k] * seconds[0] / (seconds[k] * margin) - 1.0
                    for k in range(1, len(seconds))] + [0.0])
    sd = math.sqrt(max(mean * (1.0 - mean), 0.0) / (weight + 1.0)) if weight > 0 else 0.5
    if sd == 0.0:
        return gain(mean)
    lo, hi = max(0.0, mean - 4.0 * sd), min(1.0, mean + 4.0 * sd)
    total = mass = 0.0
    for i in range(points):
        a = lo + (i + 0.5) * (hi - lo) / points
        w = math.exp(-0.5 * ((a - mean) / sd) ** 2)
        mass += w
        total += w * gain(a)
    return total / mass if mass > 0 else gain(mean)


_NORMAL = statistics.NormalDist()


@functools.lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for n <= 1)."""
    if n <= 1:
        return 0.0
    return _NORMAL.inv_cdf((n - 0.375) / (n + 0.25))


@functools.lru_cache(maxsize=1024)
def rows_alive_past_the_mean(n: int) -> float:
    """Of n rows with normal finishing steps, the mean number still running over the steps
    from their mean to the expected maximum (z = ``expected_max_normal(n)`` deviations past it):
    n * integral_0^z Q(x) dx / z, and integral_0^z Q = z Q(z) + phi(0) - phi(z). For n = 2 / 16 /
    64: 0.77 / 3.6 / 11.0 rows."""
    z = expected_max_normal(n)
    if z <= 0.0:
        return float(n)
    q = 1.0 - _NORMAL.cdf(z)
    return n * (z * q + _NORMAL.pdf(0.0) - _NORMAL.pdf(z)) / z


def finish_spreads(rates: list[float], k_max: int, remaining: list[int]) -> list[tuple[float, int]]:
    """How a static batch's rows finish at each k = 0..k_max drafts a step, each row with
    ``remaining`` tokens to generate: (the steps its last row takes beyond the longest row's
    mean, as a share of that mean; the rows close enough to the longest, within two standard
    deviations of its tokens, to finish last). The last row's steps are E[max over those
    rows], each row's tokens a step (1 + its leading accepted drafts) i.i.d. with the mean and
    variance ``rates`` give. (0.0, 0) at k = 0, where every step commits one token and rows of
    equal length finish together, and wherever a step's tokens do not vary."""
    out = [(0.0, 0)]
    longest = max(remaining, default=0)
    ordered = sorted(remaining)
    e = ex2 = run = 1.0          # P(X >= i + 1) = prod_{j <= i} a_j; E[X^2] = sum (2i + 1) P(X >= i + 1)
    for k in range(1, k_max + 1):
        run *= rates[k - 1]
        e += run
        ex2 += (2 * k + 1) * run
        var = ex2 - e * e
        if var <= 1e-12 or longest <= 0:
            out.append((0.0, 0))
            continue
        spread = 2.0 * math.sqrt(longest * var / e)
        contenders = len(ordered) - bisect.bisect_left(ordered, longest - spread)
        sd_steps = math.sqrt(longest * var / e ** 3)
        out.append((expected_max_normal(contenders) * sd_steps / (longest / e), contenders))
    return out


def expected_tokens(rates: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: tokens one verification of k drafts commits."""
    e, run = 1.0, 1.0
    for a in rates[:k]:
        run *= a
        e += run
    return e


# ---- acceptance ----------------------------------------------------------------------------
class _Rates:
    """Per-position conditional acceptance: each position keeps the mean of its own outcomes
    (an EMA at ``rate_floor`` once it has 1 / rate_floor of them) and is read shrunk toward a
    prior worth ``weight`` outcomes.

    The prior of a temperature bucket's estimates (``chain``) is the position before (position
    1: ``prior[0]``): the controller only learns position j from verifications of at least j
    drafts, and deep positions read against a fixed prior stayed near it. On an H100 a draft
    with ~0.7 acceptance at every position sat at k = 1 at batch 1 (E(4) looked like 2.6
    tokens; k = 4 commits 3.0 and ran 1.3x plain). A later generation phase's estimates
    (``parent``: the phase before, in the same bucket) take the parent's plain estimate of the
    same position, as it stands now, for their prior (their own position before, once that has
    outcomes; ``rates`` says when the cold optimism applies). A request's own estimates are shrunk
    toward its bucket and phase's, as they stood at the request's last verification: alone, a few unlucky
    outcomes (an EMA over 5 verifications) took a 0.72 draft to 0.4, k to 0, and a request at
    k = 0 never verifies again to find out."""

    def __init__(self, k_max: int, prior: list[float], weight: float, rate_floor: float,
                 chain: bool = False, optimism: float = 0.0, parent: Optional["_Rates"] = None,
                 clock: Optional[Callable[[], int]] = None, half_life: float = 0.0):
        self.prior = list(prior)
        self.value = [0.0] * k_max
        self.count = [0.0] * k_max                   # outcomes, as weighted at ``seen_at``
        self.seen_at = [0] * k_max                   # the clock at each position's last outcome
        if half_life < 0 or (half_life and clock is None):
            raise ValueError("aging outcomes needs a clock and a half-life >= 0")
        self.clock, self.half_life = clock, half_life
        self.weight, self.chain, self.optimism = weight, chain and parent is None, optimism
        self.parent = parent
        self.rate_floor = rate_floor
        self.version = 0                             # updates so far (children's caches key on it)
        self._seen: tuple = ()                       # the parents' versions the caches were read at
        self._rates: Optional[list[float]] = None
        self._plain: list[float] = []               # ``_rates`` before the cold optimism
        self._table: Optional[list[float]] = None   # E(0..k_max), until the next update

    def _versions(self) -> tuple:
        out, p = [], self.parent
        while p is not None:
            out.append(p.version)
            p = p.parent
        return tuple(out)

    def _fresh(self) -> None:
        """Drop the caches if a parent changed since they were read, or the clock moved (aged
        outcomes weigh less)."""
        if self.parent is not None or self.half_life:
            seen = self._versions()
            if self.half_life:
                seen += (self.clock(),)
            if seen != self._seen:
                self._seen = seen
                self._rates = self._table = None

    def outcomes(self, j: int) -> float:
        """Position j's outcomes, each weighted by its age: ``half_life`` clock steps halve it."""
        n = self.count[j]
        if n and self.half_life:
            n *= 0.5 ** ((self.clock() - self.seen_at[j]) / self.half_life)
        return n

    def table(self) -> list[float]:
        """E(0..k_max): the expected tokens a step commits at each k, from ``rates``."""
        rates = self.rates()
        if self._table is None:
            self._table = expected_tokens_table(rates)
        return self._table

    def update(self, k: int, accepted: int, prior: Optional[list[float]] = None) -> None:
        self._rates = self._table = None
        self.version += 1
        if prior is not None:
            self.prior = list(prior)
        now = self.clock() if self.half_life else 0
        count, value, floor = self.count, self.value, self.rate_floor
        for j in range(min(accepted + 1, k)):
            x = 1.0 if j < accepted else 0.0
            n = count[j] = (self.outcomes(j) if self.half_life else count[j]) + 1.0
            self.seen_at[j] = now
            step = 1.0 / n
            value[j] += (step if step > floor else floor) * (x - value[j])

    def plain(self) -> list[float]:
        """The estimates before the cold optimism (``rates`` reads them raised)."""
        self.rates()
        return self._plain

    def rates(self) -> list[float]:
        """The estimates as read. A later phase that no verification has reached reads its
        parent as the parent reads; once reached, it is read like a bucket of its own: each
        position shrunk toward its own position before (from the first position with outcomes
        on, positions without any chain through) or else the parent's plain estimate, its
        first cold position (fewer than COLD_OUTCOMES outcomes) raised by the optimism if it has
        outcomes or is position 1 (an untried deeper one reads the plain position before;
        ``KController._deeper`` tries it). The
        optimism therefore starts with a phase's first outcome, so that first outcome, even a
        rejection, can read higher than the parent did. Measured that way on the H100
        (837f62a); a later phase without optimism at all never learnt the demo pair's good
        later phases in replays, and one raised before its first outcome lost at batch 64."""
        self._fresh()
        if self._rates is None:
            self._rates, self._plain = self._read()
        return self._rates

    def _read(self) -> tuple[list[float], list[float]]:
        """(as read, plain) per position, as ``rates`` describes."""
        if self.parent is None and not self.chain and not self.optimism and not self.half_life:
            return self._read_plain()
        out: list[float] = []
        plain: list[float] = []
        cap = 1.0 / self.rate_floor if self.rate_floor > 0 else float("inf")
        parent = self.parent
        if parent is not None:
            inherited_plain, inherited_read = parent.plain(), parent.rates()
        reached = False          # a later phase: a position before had outcomes
        frontier = True          # no cold position before this one (the optimism's only place)
        for j, v in enumerate(self.value):
            n = self.outcomes(j)
            n_eff = min(n, cap)
            # the prior: the position before (a chain, or a later phase once reached), the
            # phase before's same position, or the fixed prior
            from_before = (self.chain or reached) and bool(out)
            if from_before:
                # (on the frontier every position before is warm: as read is plain there)
                prior, as_read = plain[-1], plain[-1]
            elif parent is not None:
                prior, as_read = inherited_plain[j], inherited_read[j]
            else:
                prior, as_read = self.prior[j], None
            reached = reached or (parent is not None and n > 0)
            if n_eff:
                a = (n_eff * v + self.weight * prior) / (n_eff + self.weight)
                plain.append(a)
                out.append(self._optimistic(a, n) if frontier else a)
            elif as_read is not None:   # nothing seen here: the prior as it reads
                plain.append(prior)
                out.append(as_read)
            else:
                plain.append(prior)
                out.append(self._optimistic(prior, 0) if frontier else prior)
            if self.optimism and n < self.COLD_OUTCOMES and (parent is None or reached):
                frontier = False
        return out, plain

    def _read_plain(self) -> tuple[list[float], list[float]]:
        """``_read`` of an estimate without a parent, chain, optimism or aging (a request's own:
        one per row, re-read after every verification): each position's mean shrunk toward its
        own prior, in one comprehension. The general loop cost ~20 us a row a step on the CPU
        machine, ~0.5 ms of host time a step at batch 64 on an H200 (T = 1, drafting)."""
        w = self.weight
        cap = 1.0 / self.rate_floor if self.rate_floor > 0 else math.inf
        out = [((c if c < cap else cap) * v + w * p) / ((c if c < cap else cap) + w) if c else p
               for c, v, p in zip(self.count, self.value, self.prior, strict=True)]
        return out, list(out)

    COLD_OUTCOMES = 64   # a position with this many outcomes reads its plain estimate

    def _optimistic(self, a: float, n: float) -> float:
        """``a`` raised by ``optimism`` standard errors of a rate read from n outcomes and the
        prior's weight while the position is cold (fewer than COLD_OUTCOMES outcomes)."""
        if (not self.optimism or not 0.0 < a < 1.0 or n >= self.COLD_OUTCOMES
                or n + self.weight <= 0):
            return a
        return min(1.0, a + self.optimism * math.sqrt(a * (1.0 - a) / (n + self.weight)))


def _outcome_count(rates: _Rates, j: int) -> float:
    """Position j's outcomes for a snapshot: a whole number unless they age."""
    n = rates.outcomes(j)
    return round(n, 1) if rates.half_life else int(n)


# a generation's phases, by the output tokens it has before a step: [0, 16), then one per power of
# two, [16, 32), [32, 64), ..., [256, ...). Coarser phases, (16, 64, 256) until 2026-11-28, let
# the low acceptance of a generation's first tokens set k = 0 for all of [16, 64), where the demo
# pair accepts most drafts: on the CPU machine the demo pair at batch 1 read 0.99x / 1.20x plain
# with them and 1.17x / 1.40x with these. On an H200 (issue 14's six cells and ramp, one run)
# each met 4 of the 6 cells; these ran nearer the best of each cell (geometric mean 0.96x
# against 0.93x) and the ramp (0.80x plain against 0.73x) (docs/bench-h200/adaptive-pow2-phases).
GENERATION_PHASES = (16, 32, 64, 128, 256)


def generation_phase(output_tokens: int, bounds: Optional[tuple[int, ...]] = None) -> int:
    """The phase of a generation with ``output_tokens`` tokens: how many of the phase bounds
    (default GENERATION_PHASES) are at or below them."""
    return bisect.bisect_right(GENERATION_PHASES if bounds is None else bounds, output_tokens)


def phase_name(phase: int, bounds: Optional[tuple[int, ...]] = None) -> str:
    bounds = GENERATION_PHASES if bounds is None else bounds
    lo = bounds[phase - 1] if phase else 0
    return f"{lo}-{bounds[phase] - 1}" if phase < len(bounds) else f"{lo}+"


class AcceptanceModel:
    """Conditional acceptance per position, per temperature bucket and generation phase, and
    per request.

    Generation phases (``GENERATION_PHASES``, by the output tokens a request has): acceptance
    moves along a generation, and one estimate per bucket learnt what the controller sampled,
    not what was there. The demo pair's greedy verifications at fixed k = 4 on the CPU machine
    (eight 128-token requests) accepted ~1 of 4 drafts a step over the first 15-25 output
    tokens and 4 of 4 in most steps after. Adaptive drafted at the start, where the optimism
    sends a cold bucket, learnt ~0.5 per position there, went to k = 0 and, at k = 0, never
    saw the later phase: 126 of 127 steps at k = 0 where fixed k = 4 ran 1.3-1.5x plain. A
    phase's estimate starts from the phase before (its prior, position by position) and
    learns its own outcomes; a request reads its current phase's. A later phase that no
    verification has reached reads the phase before as it reads, without a cold optimism of
    its own: raised before its first outcome, on an H100 (truncated draft, T = 0, batch 64)
    every phase boundary sent all 64 rows drafting, each time paying the draft's catch-up, and
    the cell fell from 1.00x to 0.83x plain (0.54x with position 1 alone raised). Once reached
    (by the probes from k = 0 or by requests that draft into it) it is read like a bucket of
    its own, optimism included (``_Rates.rates``).

    A request's own estimate belongs to one phase: when the request enters the next, its own
    is dropped and it reads the shared estimate of the new phase (and builds its own there
    from its next verifications). It also goes stale: once STALE_STEPS steps (``tick``) pass
    without a verification of its drafts, it is dropped and the request reads its bucket and phase's
    estimate again, and the next time after twice as many steps. A request's estimate is what
    put it at k = 0, and at k = 0 nothing verifies it again: on the CPU machine a demo-pair
    request whose first verifications (the start of a generation is the least predictable
    part) read 0.6 at position 1 sat at k = 0 for a hundred steps while its bucket read 0.92
    and fixed k = 4 ran 1.46x plain. The doubling bounds what a request really worse than its
    bucket costs: one retry after 32, 64, 128, ... steps.

    An optimistic start: while a bucket's position has fewer than _Rates.COLD_OUTCOMES (64)
    outcomes, it reads OPTIMISM standard errors above its estimate, sqrt(a (1 - a) /
    (outcomes + prior weight)); with nothing seen, the prior 0.6 reads 0.845. Without it a cold
    bucket whose prior alone did not pay stayed at k = 0 and learnt one outcome per probe
    (every 50, 100, 200, ... steps): on the CPU machine the demo pair at batch 16, 128 tokens,
    ran 1.07x plain against fixed k = 4's 1.30x, and 1.32x with it (same run). A useless draft
    pays with one or two drafting steps per bucket: each rejection lowers the bound. Past 64
    outcomes the estimate is read as it is: a bonus kept for good (a plain upper confidence
    bound) tipped near-ties toward drafting, 0.94x plain where fixed k = 4 ran 0.98x.

    Only the first cold position of an estimate is raised (its frontier); deeper ones read
    their plain estimate, chained from the plain position before. Raised at every cold
    position, the bonuses compounded in E(k): on an H100 (truncated draft, T = 0, batch 1)
    each request's first steps and its first steps past 64 tokens read k = 8 best (840 tok/s
    predicted against 799 at k = 4, positions 5-8 with a handful of outcomes each), and ran 6.7
    ms for 3-5 tokens where k = 4 ran 4.7 ms for ~3; fixed k = 4 ran 1.23x the adaptive cell.
    The frontier moves deeper as positions warm up, and the controller's periodic k + 1 step
    (``KController.DEEPER_EVERY``) tries the next position.

    Outcomes can age (``half_life``; off by default, HALF_LIFE = 0): an outcome then counts
    half after that many controller steps (``tick``), so an estimate nobody refreshes drifts
    back toward its prior and its cold optimism returns. At k = 0 nothing refreshes an
    estimate, and in the H100 bench (truncated draft, T = 0, batch 1) all three 128-token runs
    of a cell once stayed at k = 0 (mean k 0.08) where fixed k = 4 ran 1.3x plain. Replayed
    offline (scripts/adaptive_replay.py) on that cell's recorded outcomes, four more rejected
    outcomes in the warm-up decide between drafting (0.93x the best fixed k) and never leaving
    k = 0 (0.77x); aging lifted the second case to 0.91-0.95x. On the GPU it did not pay, in A/B runs
    beside a controller without it (docs/bench-h100/aging-ab): at batch 1, T = 0, 647 against
    618 tok/s on an H100 (half-life 64) and 664 against 666 on an H200 (half-life 128); at
    batch 64, T = 0, where every fixed k loses to plain decoding, the H200's aging controller
    drafted (mean k 2.3) and read 0.80x plain against 0.91x for the one at k = 0 (both missed
    on the H100: 0.87x with aging, 0.80x without)."""

    STALE_STEPS = 32
    OPTIMISM = 1.0
    HALF_LIFE = 0.0

    def __init__(self, k_max: int, prior: float = 0.6, prior_weight: float = 4.0,
                 shared_rate: float = 0.02, request_rate: float = 0.05,
                 optimism: Optional[float] = None, half_life: Optional[float] = None,
                 phases: Optional[tuple[int, ...]] = None):
        self.k_max = k_max
        # phase bounds in output tokens (``phase``); GENERATION_PHASES unless a variant says
        self.phases = tuple(GENERATION_PHASES if phases is None else phases)
        self.prior, self.prior_weight = prior, prior_weight
        self.shared_rate, self.request_rate = shared_rate, request_rate
        z = self.OPTIMISM if optimism is None else optimism
        h = self.HALF_LIFE if half_life is None else half_life
        clock = self._clock
        self.shared: list[list[_Rates]] = []        # [temperature bucket][generation phase]
        for _ in TEMPERATURE_BUCKETS:
            phases = [_Rates(k_max, [prior] * k_max, prior_weight, shared_rate, chain=True,
                             optimism=z, clock=clock, half_life=h)]
            for _ in self.phases:
                phases.append(_Rates(k_max, [prior] * k_max, prior_weight, shared_rate,
                                     optimism=z, parent=phases[-1], clock=clock, half_life=h))
            self.shared.append(phases)
        self.per_request: dict[str, tuple[int, _Rates]] = {}   # request id -> (phase, own estimate)
        self.steps = 0                              # controller steps so far (``tick``)
        self.recorded = 0                           # record_step calls that brought outcomes
        self._last_verified: dict[str, int] = {}    # request id -> step of its last record
        self._stale_after: dict[str, int] = {}      # request id -> steps before its own goes stale

    def _clock(self) -> int:
        """The shared estimates' clock for aging: controller steps so far."""
        return self.steps

    def phase(self, output_tokens: int) -> int:
        """The generation phase of a request with ``output_tokens`` tokens in this model."""
        return generation_phase(output_tokens, self.phases)

    def tick(self) -> None:
        """One controller step has passed."""
        self.steps += 1

    def record(self, request_id: str, bucket: int, k: int, accepted: int, phase: int = 0) -> None:
        self.record_step([(request_id, bucket, k, accepted, phase)])

    def record_step(self, verified: list[tuple[str, int, int, int, int]]) -> None:
        """One step's verifications, (request id, bucket, k, accepted, phase) each: the shared
        estimates first, then each request's own with its bucket and phase's estimate after
        the step for its prior (read once per bucket and phase: a later phase's read walks the
        phases before it, and each update of one of them invalidates it)."""
        verified = [v for v in verified if v[2] > 0]
        if verified:
            self.recorded += 1
        for _, bucket, k, accepted, phase in verified:
            self.shared[bucket][phase].update(k, accepted)
        priors: dict[tuple[int, int], list[float]] = {}
        for request_id, bucket, k, accepted, phase in verified:
            prior = priors.get((bucket, phase))
            if prior is None:
                prior = priors[(bucket, phase)] = self.shared[bucket][phase].rates()
            self._last_verified[request_id] = self.steps
            entry = self.per_request.get(request_id)
            if entry is None or entry[0] != phase:
                # a request's prior: its bucket's estimate in this phase, worth prior_weight outcomes
                entry = self.per_request[request_id] = (phase, _Rates(self.k_max, prior, self.prior_weight,
                                                                      self.request_rate))
            entry[1].update(k, accepted, prior)

    def _estimate(self, request_id: str, bucket: int, phase: int) -> _Rates:
        entry = self.per_request.get(request_id)
        if entry is None:
            return self.shared[bucket][phase]
        if entry[0] != phase:                        # a new phase: the shared estimate of it
            del self.per_request[request_id]
            return self.shared[bucket][phase]
        after = self._stale_after.get(request_id, self.STALE_STEPS)
        if self.steps - self._last_verified[request_id] > after:   # own exists: it recorded
            del self.per_request[request_id]
            self._stale_after[request_id] = 2 * after
            return self.shared[bucket][phase]
        return entry[1]

    def rates(self, request_id: str, bucket: int, phase: int = 0) -> list[float]:
        return list(self._estimate(request_id, bucket, phase).rates())   # a copy: estimates cache theirs

    def table(self, request_id: str, bucket: int, phase: int = 0) -> list[float]:
        """E(0..k_max) for this request (cached until its estimates change)."""
        return self._estimate(request_id, bucket, phase).table()

    def evidence(self, bucket: int, phase: int) -> tuple[float, float]:
        """(position 1's plain estimate, the outcomes behind it) of a bucket and phase: a
        later phase that no verification has reached reads the phase before, and so does its
        evidence. Outcomes count up to the EMA's window (1 / ``shared_rate``): an estimate
        never reads surer than that. The estimate is also worth its prior's weight
        (``prior_weight`` outcomes) on top."""
        rates = self.shared[bucket][phase]
        while rates.parent is not None and not rates.outcomes(0):
            rates = rates.parent
        cap = 1.0 / rates.rate_floor if rates.rate_floor > 0 else math.inf
        return rates.plain()[0], min(rates.outcomes(0), cap)

    def forget(self, request_id: str) -> None:
        self.per_request.pop(request_id, None)
        self._last_verified.pop(request_id, None)
        self._stale_after.pop(request_id, None)

    def snapshot(self) -> dict:
        """Per temperature bucket, per generation phase (output tokens): rates and outcomes."""
        return {name: {phase_name(i, self.phases): {"rates": [round(r, 4) for r in s.rates()],
                                       "samples": [_outcome_count(s, j) for j in range(self.k_max)]}
                       for i, s in enumerate(phases)}
                for (name, _), phases in zip(TEMPERATURE_BUCKETS, self.shared)}


# ---- cost ------------------------------------------------------------------------------------
@dataclass
class Calibration:
    """Device costs measured at start-up (seconds). ``target[i][w]``: one target forward + the
    rejection sampler at ``batches[i]`` rows of ``widths[w]`` tokens each; ``draft[i]``: one draft
    pass (forward + sampling) per proposal pass at ``batches[i]``. ``padded``: the device runs a
    batch at the next listed batch size and a verification at the next listed width (CUDA
    graphs); otherwise costs are interpolated linearly."""

    batches: list[int]
    widths: list[int]
    target: list[list[float]]
    draft: list[float]
    padded: bool = False
    seconds: float = 0.0      # how long the calibration took
    # the draft's KV-only catch-up forward over n tokens costs max(catchup_fixed, n x catchup_token):
    # eager, it is launch-bound when small and compute-bound when large (calibration.py)
    catchup_token: float = 0.0
    catchup_fixed: float = 0.0
    # up to catchup_graph_tokens it replays a ragged CUDA graph instead (runner/ragged_graphs.py):
    # max(catchup_graph_fixed, n x catchup_graph_token); 0 tokens: no such graph
    catchup_graph_tokens: int = 0
    catchup_graph_token: float = 0.0
    catchup_graph_fixed: float = 0.0

    def as_dict(self) -> dict:
        return {"batches": self.batches, "widths": self.widths, "padded": self.padded,
                "target_seconds": [[round(t, 7) for t in row] for row in self.target],
                "draft_pass_seconds": [round(t, 7) for t in self.draft],
                "catchup_seconds_per_token": round(self.catchup_token, 9),
                "catchup_seconds_fixed": round(self.catchup_fixed, 7),
                "catchup_graph_tokens": self.catchup_graph_tokens,
                "catchup_graph_seconds_per_token": round(self.catchup_graph_token, 9),
                "catchup_graph_seconds_fixed": round(self.catchup_graph_fixed, 7),
                "calibration_seconds": round(self.seconds, 3)}


def _interp(xs: list[int], ys: list[float], x: float, padded: bool) -> float:
    """ys at x: the next listed point when ``padded``, else piecewise linear (proportional
    beyond the last point, flat below the first)."""
    if padded:
        for xi, yi in zip(xs, ys):
            if xi >= x:
                return yi
        return ys[-1] * x / xs[-1]
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1] * x / xs[-1]


@dataclass
class _Ema:
    value: float = 0.0
    count: int = 0

    def add(self, x: float, rate: float) -> None:
        self.count += 1
        self.value = x if self.count == 1 else self.value + max(rate, 1.0 / self.count) * (x - self.value)


class _RecentMedian:
    """The median of the last WINDOW observations, for step times and host residuals. A slow
    step now and then (a host hiccup, another process, a kernel met late) is no cost of its k:
    in an average, even clipped at 2x, two such steps in a row at batch 16 (20.8 and 8.2 ms
    among 4.6 ms steps, H100) raised k = 3's cell by 20%, the controller went back to k = 0 and
    held it for 35 steps where k = 3 ran 1.13x faster, and the stale cell was never measured
    again. In the median of nine they change nothing; a real change in cost shows after five
    steps."""

    WINDOW = 9

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=self.WINDOW)
        self.count = 0
        self.value = 0.0

    def add(self, x: float) -> None:
        self.count += 1
        self.recent.append(x)
        ranked = sorted(self.recent)   # (statistics.median's result, without its ~3 us of Python)
        half = len(ranked) // 2
        self.value = ranked[half] if len(ranked) % 2 else (ranked[half - 1] + ranked[half]) / 2


class CostModel:
    """Predicted seconds of a decode step at batch B with k drafts per request."""

    MIN_SAMPLES = 4          # measured steps before a cell's median replaces the prediction

    def __init__(self, calibration: Calibration, rate: float = 0.1, zero_runs_ahead: bool = False):
        self.cal = calibration
        self.rate = rate
        # k = 0 steps are queued behind the previous step (decode-ahead): their host work
        # overlaps the device instead of adding to it. Until k = 0 is measured at a batch
        # bucket, it is predicted as max(scaled device, host), not device + host. The host residual
        # is learnt mostly from drafting steps, which wait for the host; adding it to k = 0 is a
        # trap: on an H100 (1.7B-like target, truncated draft, T = 0, batch 16) steps at k = 3
        # exposed ~2.6 ms of host work, k = 0 was then predicted at twice its real 2.3 ms, and
        # the controller stayed at k = 3, 0.7x plain decoding.
        self.zero_runs_ahead = zero_runs_ahead
        # batch bucket -> host seconds per step, learnt apart for plain steps (k = 0) and
        # drafting ones (more host work: drafts, probabilities, the acceptance bookkeeping)
        self.overhead: dict[int, _RecentMedian] = {}
        self.drafting_overhead: dict[int, _RecentMedian] = {}
        self.cells: dict[tuple[int, int], _RecentMedian] = {}   # (batch bucket, k) -> step seconds
        # measured k = 0 step / its calibrated device time, over every batch bucket: the
        # calibration times each forward alone, host input preparation and a synchronisation
        # included, and overstated real plain steps by ~20-25% on an H100 (2.65 ms calibrated at
        # batch 16, 2.0 ms measured). An unmeasured bucket's k = 0 is predicted at this share of
        # its calibration: at 2.65 ms, k = 2 looked 1.05x plain and ran at 0.76x.
        self.zero_scale = _Ema()
        # batch bucket -> measured drafting step / its calibrated device time, read at most 1;
        # learnt only from an eager calibration (``_drafting_scale``)
        self.drafting_scale: dict[int, _Ema] = {}
        self.device_stalls = 0   # first steps of a shape not learnt from: stalled (``observe``)
        self.drafting_observed = 0   # drafting steps learnt from (a hold at 0 sees none)
        self._target_memo: dict[tuple[int, int], float] = {}
        self._draft_memo: dict[int, float] = {}
        self._target_shapes: set[tuple[int, int]] = set()   # (batch bucket, k verified) seen

    @staticmethod
    def bucket(batch: int) -> int:
        return 1 << max(0, batch - 1).bit_length()

    def device_seconds(self, batch: int, k_verify: int, k_draft: int) -> float:
        return self.target_seconds(batch, k_verify) + (k_draft * self.draft_seconds(batch) if k_draft else 0.0)

    def draft_seconds(self, batch: int) -> float:
        """The calibrated draft pass at this batch (memoised like ``target_seconds``)."""
        d = self._draft_memo.get(batch)
        if d is None:
            cal = self.cal
            d = self._draft_memo[batch] = _interp(cal.batches, cal.draft, batch, cal.padded)
        return d

    def samples(self, batch: int, k: int) -> int:
        """Steady steps at k measured so far at this batch's bucket."""
        cell = self.cells.get((self.bucket(batch), k))
        return 0 if cell is None else cell.count

    def measured(self, batch: int, k: int) -> bool:
        """Whether steady steps at k have been measured at this batch's bucket (the measured
        cell, not the calibration, predicts them)."""
        cell = self.cells.get((self.bucket(batch), k))
        return cell is not None and cell.count >= self.MIN_SAMPLES

    def catchup_seconds(self, tokens: int) -> float:
        """The draft's forward over ``tokens`` committed tokens it skipped while k was 0: a
        ragged graph's replay up to its size, an eager forward beyond."""
        cal = self.cal
        if tokens <= 0:
            return 0.0
        if tokens <= cal.catchup_graph_tokens:
            return max(cal.catchup_graph_fixed, tokens * cal.catchup_graph_token)
        return max(cal.catchup_fixed, tokens * cal.catchup_token)

    def step_seconds(self, batch: int, k: int) -> float:
        """A steady step: verify k drafts, propose k."""
        return self._expected(batch, k, k)

    def _expected(self, batch: int, k_verify: int, k_draft: int) -> float:
        """The measured cell of a steady step once it has MIN_SAMPLES, else the calibration
        (a plain step's scaled by ``zero_scale``) plus a host residual: a plain step's learnt at
        this batch bucket (at k = 0 running ahead: the larger of the two, since they overlap),
        a drafting step's from ``_drafting_host``."""
        b = self.bucket(batch)
        cell = self.cells.get((b, k_draft)) if k_verify == k_draft else None
        if cell is not None and cell.count >= self.MIN_SAMPLES:
            return cell.value
        device = self.device_seconds(batch, k_verify, k_draft)
        plain = k_verify == k_draft == 0
        if plain and self.zero_scale.count and (self.zero_runs_ahead or b not in self.overhead):
            device *= self.zero_scale.value   # (a synchronous plain residual already holds it)
        if not plain:
            device *= self._drafting_scale(b)
            host = self._drafting_host(b)
        else:
            over = self.overhead.get(b)
            host = over.value if over else 0.0
        if plain and self.zero_runs_ahead:
            return max(device, host)
        return device + host

    # The smallest measured bucket whose drafting host residual is scaled by the rows when a
    # larger bucket borrows it (``_drafting_host``). From there up that residual is per-row
    # Python; below it fixed costs dominate and it is carried over as is.
    HOST_SCALES_FROM_MEASURED_BUCKET = 16

    def _drafting_host(self, b: int) -> float:
        """The drafting steps' host residual at batch bucket ``b``: learnt there; else the
        largest smaller bucket m's, times b / m when m >= HOST_SCALES_FROM_MEASURED_BUCKET;
        else, where plain steps wait for the host, their residual; else 0 (the first drafting
        steps measure it).

        Measured: a drafting step's host residual was 0.3 / 0.4 / 1.2 / 5.5 ms at batch 1 / 4
        / 16 / 64 on an H100, and 0.94 / 4.0 ms at batch 64 / 256 on an H200. Read as 0 at an
        unmeasured batch 16, k = 2 looked 1.04x plain and ran at 0.8x. Carried over unscaled
        from batch 64 to 256 (H200, greedy), k = 1 was predicted at 6.3 ms; a probe left k = 0
        and its steps ran 10.8-11 ms after a 16 ms catch-up, and the cell read 0.90x plain.
        A plain step's residual is no floor where plain steps run ahead of the host: what they
        teach is host work they hide (1.1 ms at batch 1, where drafting steps exposed 0.4 ms,
        and the controller stayed at k = 0 where k = 3 ran 1.13x)."""
        over = self.drafting_overhead.get(b)
        if over is not None:
            return over.value
        smaller = [m for m in self.drafting_overhead if m < b]
        if smaller:
            m = max(smaller)
            scale = b / m if m >= self.HOST_SCALES_FROM_MEASURED_BUCKET else 1.0
            return self.drafting_overhead[m].value * scale
        if not self.zero_runs_ahead:
            over = self.overhead.get(b)
        return over.value if over else 0.0

    DRAFTING_SCALE_MIN = 0.5   # the lowest drafting step / calibrated device time learnt

    def _drafting_scale(self, b: int) -> float:
        """What an eager calibration's drafting device times are worth at batch bucket ``b``:
        the moving average of measured drafting steps there over their calibrated device time,
        each read at most 1 (a step slower than its device time teaches host work instead:
        ``_drafting_host``), once steps there have taught it; 1 otherwise. Per bucket: each
        batch size was timed apart, and its error is its own.

        An eager calibration (CPU, or no CUDA graphs) times each shape three times after one
        warm-up, and drafting steps reuse it until their own (batch bucket, k) cell has
        MIN_SAMPLES steps. On the CPU machine (demo pair, batch 1) it read the draft's pass at
        5-6.4 ms where real steps spent ~3 ms a pass, and k = 4 at 45 ms where it ran 24 ms: a
        drafting cell not yet measured looked up to twice its cost, and the host residual, which
        cannot be negative, never brought it down. Holding k = 0 on such a prediction, a run of
        the demo pair drafted at k <= 1 for 520 of 525 steps and read 0.97x plain where fixed k =
        4 ran 1.24x. A graphed calibration (the GPU's, replaying the engine's own graphs five
        times after two warm-ups) keeps its device times."""
        scale = None if self.cal.padded else self.drafting_scale.get(b)
        return scale.value if scale is not None else 1.0

    STALL = 2.0   # a step above this multiple of its prediction is learned as this multiple
    ZERO_SCALE = (0.5, 1.5)   # bounds of one k = 0 step's measured / calibrated ratio

    def target_seconds(self, batch: int, k_verify: int) -> float:
        """The calibrated target forward + sampler of a step verifying ``k_verify`` drafts
        (memoised: the calibration never changes, and every step reads it a few times)."""
        key = (batch, k_verify)
        t = self._target_memo.get(key)
        if t is None:
            cal = self.cal
            col = [_interp(cal.widths, row, k_verify + 1, cal.padded) for row in cal.target]
            t = self._target_memo[key] = _interp(cal.batches, col, batch, cal.padded)
        return t

    def observe(self, batch: int, k_verify: int, k_draft: int, seconds: float,
                hidden_host: Optional[float] = None, target_seconds: Optional[float] = None) -> None:
        """A decode-only step that verified ``k_verify`` and proposed ``k_draft`` drafts per row.

        The host residual (step time beyond the calibrated device time) is what a step whose
        tokens are read before the next is queued pays on top of the device. A decode-ahead step
        hides it behind the GPU, so its own residual is near 0 and would make every k > 0 look
        as cheap as its device time; such a step teaches its host work instead
        (``hidden_host``: its wall time minus the time it blocked on the tokens). Its measured
        cell keeps its real time: k = 0 is that cheap while it runs ahead.

        The step that leaves k = 0 teaches no residual: it also runs the draft's catch-up on
        the tokens skipped at 0, which the controller prices apart (``catchup_seconds``).
        Learnt as host work, one such step made every drafting cell not yet measured look slow,
        and a controller that fell back to 0 at once never measured them.

        A stall (a kernel compiled on first use, the draft's catch-up after steps at k = 0, a
        host hiccup) is not the cost of that k: taught as is, one such step (seconds, against
        milliseconds) makes its k look slow for dozens of steps, and the controller leaves a
        good k for a losing one. Each step counts at most STALL times what was expected, so a
        real change in cost still comes through within a few steps. The first step of a target
        shape (batch bucket, drafts verified) whose target part (``target_seconds``, the
        device's own clock) ran over STALL times its calibration stalled on the device (a graph
        or kernel met for the first time) and teaches nothing (only the first: that clock also
        counts the host's input preparation and any work queued before, and skipping every
        slow step would teach drafting's costs from its fast steps alone):
        clipped, the first drafting step at batch 1 on an H100 (19.8 ms, its target part 11.4
        ms against 2.3 calibrated) still set the drafting host residual to 4 ms, k = 1 read 5.4
        ms against 2.3 at k = 0, and the controller sat at 0 for 67 steps where fixed k = 4 ran
        1.2x plain."""
        shape = (self.bucket(batch), k_verify)
        first_use = shape not in self._target_shapes
        self._target_shapes.add(shape)
        if (first_use and target_seconds
                and target_seconds > self.STALL * self.target_seconds(batch, k_verify)):
            self.device_stalls += 1
            return
        expect = self._expected(batch, k_verify, k_draft)
        seconds = min(seconds, self.STALL * expect) if expect > 0 else seconds
        b = self.bucket(batch)
        device = self.device_seconds(batch, k_verify, k_draft)
        leaving_zero = k_verify == 0 < k_draft
        drafting = bool(k_verify or k_draft) and not leaving_zero
        if drafting and not self.cal.padded and hidden_host is None and device > 0:
            scale = self.drafting_scale.setdefault(b, _Ema())
            scale.add(min(max(seconds / device, self.DRAFTING_SCALE_MIN), 1.0), self.rate)
            device *= scale.value
        if hidden_host is not None:
            residual = min(hidden_host, self.STALL * expect) if expect > 0 else hidden_host
        else:
            residual = max(0.0, seconds - device)
        if leaving_zero:
            pass   # leaving k = 0: the draft's catch-up (priced apart) is no host work of a k
        elif drafting:
            self.drafting_overhead.setdefault(b, _RecentMedian()).add(residual)
            self.drafting_observed += 1
        else:
            self.overhead.setdefault(b, _RecentMedian()).add(residual)
            if device > 0:
                scale = min(max(seconds / device, self.ZERO_SCALE[0]), self.ZERO_SCALE[1])
                self.zero_scale.add(scale, self.rate)
        if k_verify == k_draft:
            self.cells.setdefault((b, k_draft), _RecentMedian()).add(seconds)

    def snapshot(self) -> dict:
        return {"calibration": self.cal.as_dict(), "device_stalls": self.device_stalls,
                "overhead_seconds": {b: round(e.value, 7) for b, e in sorted(self.overhead.items())},
                "plain_step_over_calibration": (round(self.zero_scale.value, 4)
                                                if self.zero_scale.count else None),
                "drafting_step_over_calibration": {b: round(e.value, 4) for b, e
                                                   in sorted(self.drafting_scale.items())},
                "drafting_overhead_seconds": {b: round(e.value, 7)
                                              for b, e in sorted(self.drafting_overhead.items())},
                "measured_step_seconds": {f"{b},{k}": round(e.value, 7)
                                          for (b, k), e in sorted(self.cells.items())}}


# ---- the decision ----------------------------------------------------------------------------
@dataclass(slots=True)
class Row:
    """One sampling request as the controller sees it."""

    request_id: str
    bucket: int               # temperature bucket
    budget: int               # drafts it may still take (k shrinks near max_tokens)
    pinned: Optional[int] = None   # k fixed for this request (seeded sampling), or None
    lag: int = 0              # committed tokens the draft's KV must catch up on before drafting
    remaining: int = 0        # tokens it may still generate (0: unknown)
    phase: int = 0            # generation phase (``generation_phase`` of its output tokens)


@dataclass
class Decision:
    ks: list[int]                        # per row
    k: int                               # the batch's k (before budgets and pins)
    predicted_speedup: Optional[float] = None   # goodput(k) / goodput(0)
    goodput: list[float] = field(default_factory=list)   # tokens/s predicted for k = 0..k_max


class KController:
    """Chooses each step's k; ``force`` (tests) overrides it: ``force(row) -> k`` per row."""

    HYSTERESIS = 1.03        # a new k must promise this much more than the current one
    # Leaving k = 0 costs more than the step times show: every row's draft KV must first catch
    # up on the tokens committed while nobody drafted (``Row.lag``; a draft forward over all of
    # them, ``CostModel.catchup_seconds``). A switch up is taken only if the time it saves over
    # the next HORIZON_STEPS steps (or the batch's remaining tokens, if fewer) pays for that.
    # Measured on an H100 (8B-like target, batch 16): near-ties flipping in and out of 0 without
    # this made adaptive 0.46x plain with a self-draft.
    HORIZON_STEPS = 32
    EXPLORE_EVERY = 50       # steps at k = 0 before the first probing step at k = 1 ...
    EXPLORE_MAX = 800        # ... doubling after each probe that does not pay, up to this
    PROBE_BUDGET = 0.02      # a probe (its catch-up included) costs at most this share of the
    #                          time spent at k = 0 since the last one; otherwise it waits
    # At k = 0 the decision's inputs drift slowly at an unchanged batch size: no verification
    # feeds the acceptance model, the k = 0 cost cell moves by one step's time, lag and remaining
    # tokens by one token a row. So the full evaluation runs only every ZERO_RECHECK-th such step
    # and the others cost a counter (``hold_zero``); they keep k = 0, which a full evaluation
    # would also choose unless one of those slow inputs crossed a threshold in between. Leaving
    # 0 is at most ZERO_RECHECK - 1 steps late, against a catch-up horizon of HORIZON_STEPS.
    # A full evaluation costs Python per row (~1 ms at 256 rows on the 2-core CPU machine), so
    # large batches recheck one step in batch / ZERO_RECHECK_ROWS instead: at batch 256, every
    # 4th step's evaluation alone took ~0.3 ms a step there, where the H100 steps batch 256 in
    # ~7.5 ms with the host as the bottleneck (cells at k = 0 read 0.89-0.95x plain). At batch
    # 64 and T = 1 the H100 steps are host-bound too (2.36 ms of kernels a step, 3.1 ms a step
    # plain, 3.5 ms adaptive at k = 0, same kernels): one recheck in batch / 8 steps, not / 16.
    # What a drafting step teaches (a probe's outcomes and step time: ``_evidence``) is no slow
    # input: it ends a hold at once, so it is never read a period late.
    ZERO_RECHECK = 4
    ZERO_RECHECK_ROWS = 8
    # The acceptance model learns position j only from verifications of at least j drafts: a
    # position past the current k keeps whatever its first few outcomes said. In a replay of the
    # H100 trace (0.76 acceptance at every position) one rejection at position 2 read it at 0.67
    # and held k = 1 for 395 steps in 9 of 50 seeds. Every DEEPER_EVERY steps at one k > 0, a
    # step drafts k + 1 if that is predicted to lose at most DEEPER_LOSS of the goodput, or if
    # position k + 1 has fewer than DEEPER_SAMPLES outcomes in a bucket of the batch (a low
    # estimate from few outcomes would otherwise keep the probe from ever running).
    DEEPER_EVERY = 16
    DEEPER_LOSS = 0.10
    DEEPER_SAMPLES = 32
    # k = 0 is predicted from the start-up calibration until plain steps are measured at the
    # batch bucket, and a controller that drafts from the start never measures them. On an H100
    # (truncated draft, T = 0, batch 16) k = 0 was predicted at 2.55 ms where it runs in 2.25
    # ms, k = 3 looked 1.1-1.16x plain, and the cell read 0.80-0.94x plain. After
    # ZERO_PROBE_AFTER steps drafting in one batch bucket, a step goes to 0 when drafting is
    # predicted to gain less than ZERO_PROBE_MARGIN and k = 0 is not measured at this bucket
    # yet, and holds there until it is (at most ZERO_PROBE_STEPS steps; prompt steps and the
    # step that verifies the last drafts teach no plain cost), then decides in full. A bucket
    # is probed at most ZERO_PROBES_PER_BUCKET times; a clear gain is left alone.
    ZERO_PROBE_AFTER = 8
    ZERO_PROBE_MARGIN = 1.2
    ZERO_PROBE_STEPS = 8
    ZERO_PROBES_PER_BUCKET = 2
    # A drafting step runs the plain step's target forward (wider) and the draft's passes, so a
    # measured k = 0 cell that reads slower than the drafting k chosen is stale: its median
    # caught a slow stretch, and a controller that keeps drafting never measures 0 again. On the
    # CPU machine (random draft, acceptance ~0, batch 16) plain steps read 32.5 ms where they ran
    # in ~17, k = 1 was predicted at 29 ms, and the cell drafted through most of three repeats
    # (0.43x plain). Such a cell is re-measured: a step goes to 0 and holds there until
    # STALE_ZERO_SAMPLES new plain steps (a majority of the median's window) are in, at most
    # STALE_ZERO_PROBES times a bucket.
    STALE_ZERO_SAMPLES = 5
    STALE_ZERO_PROBES = 4
    # Probes paid by the evidence. The schedule above (EXPLORE_EVERY, doubling) probes as
    # seldom for a draft that a handful of outcomes put below break-even as for one that
    # thousands put at zero. Each probe verifies one draft a row: at batch 1 its one outcome
    # decides the next. In replays of an H100 trace (truncated draft, T = 0, batch 1, acceptance
    # ~0.78) the warm-up's four rejected outcomes held k = 0; a probe 26 steps into the first
    # request was accepted and the controller drafted (0.93x the best fixed k), one 22 steps in
    # was rejected and it never drafted again (0.77x); three GPU runs of that cell read 0.77x,
    # 0.88x and 0.97x. So, besides the schedule, every step at k = 0 sets aside a share of its
    # time for probes: PROBE_GAIN_FACTOR times the speed-up drafting is expected to bring
    # (``expected_gain``: position 1's estimate read as a Beta of its outcomes, the option
    # value of an uncertain one included), at most PROBE_SHARE_MAX. A probe runs once the
    # share saved covers its cost (its catch-up and its wider step). A few rejections leave
    # some chance that drafting pays and the probes come every few steps until the outcomes
    # decide; a draft read at 0.05 from 50 outcomes costs nothing more. Replayed on the H100
    # data (scripts/adaptive_replay.py --probe-shares) a factor of 16 took that trace's stuck
    # case from 0.77x to 0.92x the best fixed k (median of 20 replays), and cost 0-2% at
    # batch 16 and 64, where drafting and plain decoding are near a tie.
    PROBE_SHARE_MAX = 0.25
    PROBE_GAIN_FACTOR = 16.0
    PROBE_EVIDENCE_OUTCOMES = 16
    # A static batch's end. Plain decoding commits one token a row a step, so rows of equal
    # length finish together; drafting commits 1..k + 1 and they finish unevenly, so the
    # batch's last steps run part-empty at nearly a full step's cost (a decode step reads the
    # weights whatever the batch). With no request waiting to take a finished row's place
    # (``waiting``, set by SpecControl), the batch's tokens per second are its tokens over its
    # longest row's time: each k's goodput is divided by 1 + its ``finish_spreads`` (E[max over rows
    # of their steps] / E[steps] - 1), the extra steps priced at a part-empty batch's step
    # time. On the H100 (truncated draft, T = 0, batch 64, 128 tokens) a
    # drafting step was predicted 1.03-1.08x plain and fixed k = 2 ran 0.92x: its rows needed
    # ~56.5 steps on average and the batch ~62. The stretch is small where drafting gains a
    # lot, at batch 1 it is 1.0, and with requests waiting it is not applied (finished rows
    # are refilled). Its price elsewhere: a server with free rows and an empty queue is priced
    # as a static batch too, and ``remaining`` runs to max_tokens, so rows that will end on EOS
    # are priced as if they ran to it; at 64 equal rows a near-tie is tipped toward k = 0 by
    # ~11% of goodput at 127 tokens left and ~2% at 4,096 (a near-tie costs little either way).
    TAIL_PRICING = True

    def __init__(self, k_max: int, mode: str, cost: Optional[CostModel],
                 acceptance: Optional[AcceptanceModel] = None,
                 probe_share_max: Optional[float] = None, tail_pricing: Optional[bool] = None):
        self.k_max, self.mode, self.cost = k_max, mode, cost
        self.probe_share_max = self.PROBE_SHARE_MAX if probe_share_max is None else probe_share_max
        self.tail_pricing = self.TAIL_PRICING if tail_pricing is None else tail_pricing
        self.waiting = 0             # requests queued for a row (SpecControl.plan sets it)
        self.acceptance = acceptance or AcceptanceModel(k_max)
        self.force: Optional[Callable[[Row], int]] = None
        # adaptive starts from plain decoding: the first k > 0 must pay for itself, catch-up
        # included (on an H100 a start at k = 2 with a useless draft paid a first-use compile
        # of the draft's catch-up, 0.9 s, in its first requests)
        self.current = k_max if mode == "fixed" else 0
        self.steps_at_zero = 0
        self.seconds_at_zero = 0.0   # predicted seconds of those steps
        self.explore_every = self.EXPLORE_EVERY
        self.last: Optional[Decision] = None
        self.measured_tps: Optional[_Ema] = None   # committed tokens/s of decode steps
        self.plain_tps: Optional[_Ema] = None      # predicted plain tokens/s at the same batches
        self.chosen_counts = [0] * (k_max + 1)
        self._held = 0               # steps held at 0 since the last full evaluation
        self._held_batch = -1        # the batch size of that evaluation
        self._held_seconds = 0.0     # and its predicted step time at k = 0
        self._held_evidence = (0, 0) # and ``_evidence()`` then
        self.steps_at_k = 0          # steps at the current k > 0 since it was chosen or passed
        self.steps_drafting = 0      # steps at k > 0 in one bucket since the last step at 0
        self._drafting_bucket = -1   # ... that bucket
        self.zero_probes = 0         # steps sent to 0 to measure it (ZERO_PROBE_AFTER)
        self._probing_zero = False   # held at 0 until plain steps are measured (a k = 0 probe)
        self._zero_probe_counts: dict[int, int] = {}
        self._zero_samples_wanted = 0    # a k = 0 probe holds until its cell has this many steps
        self._stale_probe_counts: dict[int, int] = {}
        self._probe_waiting = False  # a probe fell due and could not be afforded yet
        self.probe_credit = 0.0      # seconds at k = 0 set aside for probes (PROBE_SHARE_MAX)
        self._probe_share = 0.0      # ... their share, as the last full evaluation read it
        self._probe_cost = math.inf  # ... and a probe's cost then
        self.evidence_probes = 0     # probes the credit paid for

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"

    def recheck_every(self, batch: int) -> int:
        """Steps between full evaluations while held at k = 0 at this batch size."""
        return max(self.ZERO_RECHECK, batch // self.ZERO_RECHECK_ROWS)

    def _evidence(self) -> tuple[int, int]:
        """Counts of what only drafting steps teach (a probe's): steps whose outcomes the
        acceptance model recorded, drafting steps the cost model learnt from."""
        return self.acceptance.recorded, self.cost.drafting_observed if self.cost else 0

    def hold_zero(self, batch: int) -> bool:
        """Whether this step stays at k = 0 without a full ``decide``: adaptive, at 0 after a
        full evaluation in this batch bucket (the cost model's power of two: its step times are
        one padded graph's) less than ``recheck_every(batch)`` steps ago, and no probe due. A held step
        counts as a step at 0 (probes, ``chosen_counts``) like a decided one. Holding only at
        an unchanged batch size left a load ramp, whose batch changes every step, with a full
        evaluation each step: ~1 ms of Python at 250 rows, and the ramp at 0.83x plain. A probe
        that fell due but could not be afforded (its catch-up grows with the rows' lag, faster
        than the time at 0 that pays for it at a large batch) is re-checked at the periodic
        evaluations only: re-checked every step, it cost a full evaluation per step at batch
        256 (3-6 ms of Python on the CPU machine; batch-256 cells at k = 0 read 0.90-0.94x
        plain on the H100). What a drafting step taught since that evaluation (``_evidence``: a
        probe's outcomes and step time) ends the hold, except in a k = 0 probe, which holds
        until its cell is measured."""
        probing = self._probing_zero   # a k = 0 probe holds until measured, not a recheck period
        if (self.current != 0 or self.force is not None or not self.adaptive or self.cost is None
                or self._held_batch < 0 or self.cost.bucket(batch) != self.cost.bucket(self._held_batch)
                or self._held >= (self.ZERO_PROBE_STEPS if probing else self.recheck_every(batch) - 1)
                or (not probing and self._evidence() != self._held_evidence)
                or (probing and self.cost.samples(batch, 0) >= self._zero_samples_wanted)
                or (not probing and self.steps_at_zero + 1 >= self.explore_every
                    and not self._probe_waiting)
                or (not probing and self._evidence_probe_due(self._probe_share * self._held_seconds))):
            self._probing_zero = False
            return False
        self._held += 1
        self.steps_at_zero += 1
        self.seconds_at_zero += self._held_seconds
        if not probing:
            self.probe_credit += self._probe_share * self._held_seconds
        self.chosen_counts[0] += batch
        return True

    def decide(self, rows: list[Row]) -> Decision:
        if self.force is not None:
            ks = [max(0, min(self.force(r), r.budget, self.k_max)) for r in rows]
            return self._keep(Decision(ks, max(ks, default=0)))
        if not self.adaptive or self.cost is None:
            return self._keep(Decision([min(self.k_max, r.budget) for r in rows], self.k_max))
        if not any(r.budget for r in rows):
            # every row is at its last token: nothing can be drafted, whatever k is best. The
            # batch's k is left as it was: read as a choice of 0 (every k ties on tokens and 0 is
            # cheapest), it held the next request at 0 for a recheck period and fed its prompt
            # nowhere, and at batch 1 (H100, truncated draft, T = 1, ~17 steps a request) the
            # next request lost ~3 steps of k = 8: 0.82x fixed k = 8
            return self._keep(Decision([0] * len(rows), self.current))
        batch = len(rows)
        pin = max((r.pinned for r in rows if r.pinned is not None), default=0)
        tokens = self._expected_tokens_by_k(rows)
        seconds = [self.cost.step_seconds(batch, max(k, pin)) for k in range(self.k_max + 1)]
        goodput = [t / s for t, s in zip(tokens, seconds)]
        if self.tail_pricing and self.waiting == 0 and max(goodput[1:], default=0.0) > goodput[0]:
            self._price_the_end(rows, goodput, pin)   # (it only lowers k > 0: needless when 0 wins)
        best = max(range(self.k_max + 1), key=lambda k: goodput[k])
        if goodput[best] < goodput[self.current] * self.HYSTERESIS:
            best = self.current
        lag = sum(r.lag for r in rows if r.pinned is None and r.budget > 0)   # rows that would draft
        leaving_zero = best > 0 and self.current == 0   # (while drafting, new prompts go to the draft)
        if leaving_zero and lag and not self._catchup_pays(rows, tokens, goodput, best, lag):
            best = 0
        if best > 0 and self.current > 0:
            b = self.cost.bucket(batch)
            if b != self._drafting_bucket:
                self._drafting_bucket, self.steps_drafting = b, 0
            self.steps_drafting += 1
            if (self.steps_drafting >= self.ZERO_PROBE_AFTER
                    and goodput[best] < self.ZERO_PROBE_MARGIN * goodput[0]
                    and not self.cost.measured(batch, 0)
                    and self._zero_probe_counts.get(b, 0) < self.ZERO_PROBES_PER_BUCKET):
                best = 0
                self._probe_zero(self._zero_probe_counts, b, self.cost.MIN_SAMPLES)
            elif (pin == 0 and seconds[0] > seconds[best] and self.cost.measured(batch, 0)
                    and self._stale_probe_counts.get(b, 0) < self.STALE_ZERO_PROBES):
                best = 0                               # k = 0's cell is stale: measure it again
                self._probe_zero(self._stale_probe_counts, b,
                                 self.cost.samples(batch, 0) + self.STALE_ZERO_SAMPLES)
        if best == 0:
            self.steps_drafting = 0
            self.steps_at_zero += 1
            self.seconds_at_zero += seconds[0]
            probe_cost = self._probe_step_cost(seconds, lag)
            if not self._probing_zero:
                self._probe_share = self._probe_share_now(rows, seconds)
                self._probe_cost = probe_cost
                self.probe_credit += self._probe_share * seconds[0]
            if self.steps_at_zero >= self.explore_every:
                self._probe_waiting = probe_cost > self.PROBE_BUDGET * self.seconds_at_zero
                if not self._probe_waiting:
                    self.steps_at_zero, self.seconds_at_zero, best = 0, 0.0, 1
                    self.explore_every = min(2 * self.explore_every, self.EXPLORE_MAX)
            if best == 0 and not self._probing_zero and self._evidence_probe_due():
                self.steps_at_zero, self.seconds_at_zero, best = 0, 0.0, 1
                self.evidence_probes += 1
            if best or not self._probe_share:   # (no credit saved up for a later share)
                self.probe_credit = 0.0
        else:
            self.probe_credit = 0.0
            self._probe_waiting = False
            self.steps_at_zero, self.seconds_at_zero = 0, 0.0
            if self.current != 0:                          # speculation paid beyond a probe
                self.explore_every = self.EXPLORE_EVERY
            best = self._deeper(best, goodput, rows)
        self.current = best
        self._held, self._held_batch, self._held_seconds = 0, batch, seconds[0]
        self._held_evidence = self._evidence()
        ks = [min(r.pinned if r.pinned is not None else best, r.budget) for r in rows]
        speedup = goodput[best] / goodput[0] if goodput[0] > 0 else None
        return self._keep(Decision(ks, best, speedup, goodput))

    def _probe_zero(self, counts: dict[int, int], bucket: int, samples_wanted: int) -> None:
        """Send the batch to k = 0 and hold it there (``hold_zero``) until the bucket's k = 0 cell
        has ``samples_wanted`` plain steps; ``counts``: this kind of probe per bucket."""
        self.zero_probes += 1
        counts[bucket] = counts.get(bucket, 0) + 1
        self._probing_zero = True
        self._zero_samples_wanted = samples_wanted

    def _deeper(self, best: int, goodput: list[float], rows: list[Row]) -> int:
        """``best``, or ``best + 1`` for one step once ``best`` has held DEEPER_EVERY steps,
        when that is predicted to cost at most DEEPER_LOSS of the goodput or the position it
        adds has few outcomes yet."""
        if best != self.current:
            self.steps_at_k = 0
            return best
        self.steps_at_k += 1
        if self.steps_at_k < self.DEEPER_EVERY or best >= self.k_max:
            return best
        few = min(self.acceptance.shared[b][p].outcomes(best) for b, p in {(r.bucket, r.phase) for r in rows}) \
            < self.DEEPER_SAMPLES
        if few or goodput[best + 1] >= (1.0 - self.DEEPER_LOSS) * goodput[best]:
            self.steps_at_k = 0
            return best + 1
        return best

    def _catchup_pays(self, rows: list[Row], tokens: list[float], goodput: list[float], k: int,
                      lag: int) -> bool:
        """Whether drafting at ``k`` saves, over the horizon, more than the draft's catch-up
        on ``lag`` skipped tokens costs."""
        horizon = self.HORIZON_STEPS * tokens[k]
        remaining = sum(r.remaining for r in rows)
        if remaining and all(r.remaining for r in rows):
            horizon = min(horizon, remaining)
        saved = horizon / goodput[0] - horizon / goodput[k] if goodput[0] > 0 and goodput[k] > 0 else 0.0
        return saved > self.cost.catchup_seconds(lag)

    def _price_the_end(self, rows: list[Row], goodput: list[float], pin: int = 0) -> None:
        """Divide each k's goodput by the batch's stretch at k: 1 + its ``finish_spreads``,
        those extra steps priced at the batch they run with (``rows_alive_past_the_mean``: a
        sixth of 64 contending rows, a quarter of 16) against the full batch's step, both at
        ``max(k, pin)`` like the step times. (The batch matters where a step's cost grows with
        its rows, as on the CPU; a memory-bound GPU step costs nearly the same at any batch.)
        Only when every row that would draft knows its remaining tokens (read with the
        estimates of the one with most left)."""
        drafting = [r for r in rows if r.pinned is None and r.budget > 0]
        if not drafting or not all(r.remaining for r in drafting):
            return
        longest = max(drafting, key=lambda r: r.remaining)
        rates = self.acceptance.rates(longest.request_id, longest.bucket, longest.phase)
        batch = len(rows)
        spreads = finish_spreads(rates, self.k_max, [r.remaining for r in drafting])
        for k in range(1, self.k_max + 1):
            spread, contenders = spreads[k]
            if spread > 0.0:
                kk = max(k, pin)
                alive = max(1, round(rows_alive_past_the_mean(contenders)))
                tail = self.cost.step_seconds(alive, kk) / self.cost.step_seconds(batch, kk)
                goodput[k] /= 1.0 + spread * min(1.0, tail)

    def _evidence_probe_due(self, more: float = 0.0) -> bool:
        """Whether the credit saved for probes, with ``more`` seconds of it, covers a probe's
        cost (a probe that costs nothing is no measurement of the draft: never due)."""
        return bool(self._probe_share) and self._probe_cost > 0 and self.probe_credit + more >= self._probe_cost

    def _probe_share_now(self, rows: list[Row], seconds: list[float]) -> float:
        """The share of a step at k = 0 set aside for probes: PROBE_GAIN_FACTOR times the
        mean, over the rows that would draft, of ``expected_gain`` for their bucket and phase
        (at HYSTERESIS), counting only estimates with fewer than PROBE_EVIDENCE_OUTCOMES
        outcomes (the others add 0); at most ``probe_share_max``."""
        if self.probe_share_max <= 0 or len(seconds) < 2:
            return 0.0
        groups: dict[tuple[int, int], int] = {}
        for r in rows:
            if r.pinned is None and r.budget > 0:
                key = (r.bucket, r.phase)
                groups[key] = groups.get(key, 0) + 1
        if not groups:
            return 0.0
        gain = 0.0
        for (b, p), n in groups.items():
            mean, outcomes = self.acceptance.evidence(b, p)
            if outcomes < self.PROBE_EVIDENCE_OUTCOMES:
                gain += n * expected_gain(mean, outcomes + self.acceptance.prior_weight, seconds,
                                          self.HYSTERESIS)
        return min(self.probe_share_max, self.PROBE_GAIN_FACTOR * gain / sum(groups.values()))

    def _probe_step_cost(self, seconds: list[float], lag: int) -> float:
        """A probing step at k = 1 beyond a step at k = 0: its catch-up and its wider step
        (``seconds`` are this batch's step times by k). A scheduled probe runs when this is
        within PROBE_BUDGET of the time spent at k = 0 since the last probe; an evidence probe
        when the credit covers it."""
        return self.cost.catchup_seconds(lag) + max(0.0, seconds[1] - seconds[0])

    def _expected_tokens_by_k(self, rows: list[Row]) -> list[float]:
        """Sum over rows of E(min(k, budget)) (pinned rows: their pin) for every batch k.

        Runs every step, so it is O(rows x k_max): one E table per distinct (rates, budget, pin);
        rows without their own history share their bucket and phase's table."""
        free: dict = {}                    # rows that take whatever k the batch takes: table -> count
        groups: dict = {}                  # the others: (table, budget, pin) -> rows
        for r in rows:
            table = self.acceptance.table(r.request_id, r.bucket, r.phase)
            if r.pinned is None and r.budget >= self.k_max:
                f = free.get(id(table))
                if f is None:
                    free[id(table)] = [table, 1]
                else:
                    f[1] += 1
                continue
            key = (id(table), r.budget, r.pinned)
            g = groups.get(key)
            if g is None:
                groups[key] = [table, r, 1]
            else:
                g[2] += 1
        total = [0.0] * (self.k_max + 1)
        for table, n in free.values():
            for k in range(self.k_max + 1):
                total[k] += n * table[k]
        for table, r, n in groups.values():
            for k in range(self.k_max + 1):
                total[k] += n * table[min(r.pinned if r.pinned is not None else k, r.budget)]
        return total

    def _keep(self, d: Decision) -> Decision:
        self.last = d
        for k in d.ks:
            self.chosen_counts[k] += 1
        return d

    def observe_step(self, batch: int, k_verify: int, k_draft: int, tokens: int,
                     seconds: float, hidden_host: Optional[float] = None,
                     target_seconds: Optional[float] = None) -> None:
        """A decode-only step: every row verified ``k_verify`` (the widest row) and proposed up
        to ``k_draft`` drafts; ``tokens`` were committed in ``seconds``. ``hidden_host``: the
        host work of a step the GPU did not wait for (decode-ahead); ``target_seconds``: its
        target part; see CostModel.observe."""
        if self.cost is None or batch <= 0 or seconds <= 0:
            return
        self.cost.observe(batch, k_verify, k_draft, seconds, hidden_host, target_seconds)
        if self.measured_tps is None:
            self.measured_tps, self.plain_tps = _Ema(), _Ema()
        self.measured_tps.add(tokens / seconds, 0.05)
        self.plain_tps.add(batch / self.cost.step_seconds(batch, 0), 0.05)

    @property
    def measured_speedup(self) -> Optional[float]:
        """Recent committed tokens/s over the cost model's plain decoding at the same batches."""
        if self.measured_tps is None or not self.plain_tps.value:
            return None
        return self.measured_tps.value / self.plain_tps.value

    def snapshot(self) -> dict:
        last = self.last
        return {"mode": self.mode, "k_max": self.k_max, "current_k": self.current,
                "chosen_k_counts": list(self.chosen_counts),
                "zero_probes": self.zero_probes,
                "evidence_probes": self.evidence_probes,
                "probe_share": round(self._probe_share, 4),
                "predicted_speedup": None if last is None else last.predicted_speedup,
                "measured_speedup": self.measured_speedup,
                "goodput_tokens_per_s": [] if last is None else [round(g, 2) for g in last.goodput],
                "acceptance": self.acceptance.snapshot(),
                "cost": None if self.cost is None else self.cost.snapshot()}


# ---- the engine's side -----------------------------------------------------------------------
class SpecControl:
    """What EngineCore calls: ``plan`` after scheduling (sets each sampling request's
    ``k_next``), ``committed`` once the scheduler has committed the step, ``after_step`` with
    the step's stats, and ``prepare_next`` once the next step is queued on the device.

    **Deciding one step ahead.** A drafting step's tokens are read before the next step can be
    scheduled, so whatever the host does between that read and the next launch leaves the GPU
    idle. Two parts of it need no token of the step just read: feeding the acceptance model
    (``record``: per request and position, ~190 us a step at batch 64 on the CPU machine) and
    the controller's evaluation (``KController.decide``). So while drafting, both run in
    ``prepare_next``, after the next step (N + 1) is queued and while the GPU runs it:
    step N's outcomes are recorded, and the controller decides the batch's k for step N + 2 from
    N + 1's rows as they were scheduled. ``plan`` for N + 2 then only applies that k to each row
    (capped by its own budget, seeded rows at their pin). The cost: k is chosen from outcomes
    one step older (through N, not N + 1) and from row lengths one step old; a row that joins
    at N + 2 takes the batch's k. Neither changes which tokens come out (the sampler is exact
    for any k, and a seeded row's tokens never depend on k). Where k must follow each row (a
    ``force`` function), at k = 0 (decode-ahead plans those steps before the read anyway) and
    without a queued step (async scheduling off), ``plan`` decides in full as before; the
    outcomes are then recorded before it, unless the decision cannot use them (fixed k)."""

    # The snapshot other threads read (/debug/state) is refreshed after at least SNAPSHOT_EVERY
    # steps and SNAPSHOT_SECONDS, and after a step that leaves no request running or waiting.
    # Every 32 steps alone it cost ~0.4-0.9 ms of Python each at batch 64 on the CPU machine
    # (~13 us a step), ~13 refreshes a second of a host-bound H100 batch, for a page a person
    # reads.
    SNAPSHOT_EVERY = 32
    SNAPSHOT_SECONDS = 0.5

    def __init__(self, k_max: int, mode: str, max_model_len: int, pin_seeded: bool,
                 calibration: Optional[Calibration], zero_runs_ahead: bool = False):
        cost = CostModel(calibration, zero_runs_ahead=zero_runs_ahead) if calibration is not None else None
        self.controller = KController(k_max, mode, cost)
        self.max_model_len = max_model_len
        self.pin_seeded = pin_seeded and mode == "adaptive"
        self._fixed: dict[str, tuple[int, Optional[int]]] = {}   # request id -> _fixed_part
        # request id -> (generation phase of the drafts it proposes this step, of those it
        # verifies this step: the phase the step before planned them in)
        self._phases: dict[str, tuple[int, int]] = {}
        # deciding one step ahead (class docstring): (the controller that decided, its decision
        # for the next step planned), outcomes committed but not yet recorded, and the decision
        # the latest ``plan`` applied (its step's own, for the stats)
        self._ahead: Optional[tuple[KController, Decision]] = None
        self._unrecorded: list[tuple[str, int, int, int, int]] = []
        self.applied: Optional[Decision] = None
        self.decided_ahead = 0   # steps planned from a decision made one step ahead
        self.snapshot: dict = self._snapshot()   # replaced whole, never mutated
        self._snapshot_at = time.monotonic()
        self._since_snapshot = 0

    def _snapshot(self) -> dict:
        return {**self.controller.snapshot(), "steps_decided_ahead": self.decided_ahead}

    def _fixed_part(self, req) -> tuple[int, Optional[int]]:
        """(temperature bucket, pinned k) of a request, computed once: its parameters never
        change (dropped in ``forget``)."""
        f = self._fixed.get(req.request_id)
        if f is None:
            p = req.params
            pinned = 0 if self.pin_seeded and p.seed is not None and p.temperature > 0 else None
            f = self._fixed[req.request_id] = (temperature_bucket(p.temperature), pinned)
        return f

    @property
    def at_zero(self) -> bool:
        """Adaptive k whose last decision was k = 0 for the batch (decode-ahead plans the next
        step before this one's tokens are read only then)."""
        ctl = self.controller
        return ctl.adaptive and ctl.current == 0 and ctl.force is None

    @property
    def k_max(self) -> int:
        return self.controller.k_max

    def plan(self, scheduled: list, unread: int = 0, waiting: int = 0) -> None:
        """Runs every step over every sampling request: the per-row work is a few integer
        operations (the fixed part is cached per request), so k = 0 costs next to nothing.
        ``unread``: tokens each request has sampled that its token list does not hold yet
        (decode-ahead plans a step before the previous one is read; its rows all sample, with
        k_next = 0 until planned here). ``waiting``: requests queued for a row (none: the
        controller prices the batch's end, ``KController.TAIL_PRICING``)."""
        ctl = self.controller
        ctl.acceptance.tick()
        ctl.waiting = waiting
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is ctl and self._evaluates():
            self._apply(scheduled, ahead[1], unread)
            return
        decode_only = unread > 0   # decode-ahead's continuation: every row samples, k_next = 0
        if ctl.current == 0 and ctl.hold_zero(len(scheduled) if decode_only else
                                              sum(1 for s in scheduled if s.samples)):
            if not decode_only:   # (the continuation's rows are already what a hold sets)
                self._mark(scheduled, hold=True)
            return
        sampling = [s for s in scheduled if s.samples]
        if sampling:
            rows = self._rows(sampling, unread)
            for r in rows:
                self._note_phase(r.request_id, r.phase)
            decision = self.applied = ctl.decide(rows)
            for s, k in zip(sampling, decision.ks):
                s.k_next = k
        self._mark(scheduled, hold=False)

    def _rows(self, scheduled: list, unread: int = 0) -> list[Row]:
        """The controller's view of a step's sampling requests: budget (drafts that fit once
        this step's token is committed), pin, the draft's lag, tokens it may still generate
        and generation phase."""
        ctl, k_max, max_len = self.controller, self.controller.k_max, self.max_model_len
        rows = []
        for s in scheduled:
            if not s.samples:
                continue
            req = s.request
            f = self._fixed_part(req)
            n = len(req.token_ids) + unread
            left = req.max_tokens - (n - req.prompt_len)
            rows.append(Row(req.request_id, f[0], req.spec_budget(k_max, max_len, 1 + unread), f[1],
                            max(0, n - 1 - req.num_draft_computed), left if left > 0 else 0,
                            ctl.acceptance.phase(n - req.prompt_len)))
        return rows

    def _note_phase(self, request_id: str, phase: int) -> None:
        """The generation phase a request is planned in this step; the one before is kept for
        ``record`` (this step verifies the drafts planned then)."""
        before = self._phases.get(request_id)
        self._phases[request_id] = (phase, phase if before is None else before[0])

    def _apply(self, scheduled: list, decision: Decision, unread: int) -> None:
        """``plan`` from a decision made one step ahead: each sampling row takes the batch's k
        (seeded rows their pin), capped by its own budget; the controller's ``chosen_counts``
        count these rows (``prepare_next`` took back the forecast rows' counts)."""
        ctl, k_max, max_len = self.controller, self.controller.k_max, self.max_model_len
        k, counts = decision.k, ctl.chosen_counts
        for s in scheduled:
            if not s.samples:
                continue
            req = s.request
            pinned = self._fixed_part(req)[1]
            phase = ctl.acceptance.phase(len(req.token_ids) + unread - req.prompt_len)
            self._note_phase(req.request_id, phase)
            s.k_next = min(k if pinned is None else pinned, req.spec_budget(k_max, max_len, 1 + unread))
            counts[s.k_next] += 1
        self.applied = decision
        self.decided_ahead += 1
        self._mark(scheduled, hold=False)

    def _evaluates(self) -> bool:
        """Whether the controller decides by evaluating the batch (an adaptive controller with
        a cost model and no per-row ``force``): only such a decision reads the acceptance
        model, and only it can be made one step ahead (fixed k and ``force`` follow each row)."""
        ctl = self.controller
        return ctl.adaptive and ctl.force is None and ctl.cost is not None

    def _needs_outcomes_now(self) -> bool:
        """Whether the next ``plan`` reads the acceptance model: a full evaluation, not a
        decision made ahead (that one was made with them already)."""
        return self._ahead is None and self._evaluates()

    def committed(self, scheduled: list) -> None:
        """The scheduler has committed this step: its verifications go to the acceptance
        model now if the next ``plan`` reads it, else in ``prepare_next``, off the path
        between this step's read and the next launch."""
        verified = self._verified(scheduled)
        if self._needs_outcomes_now():
            if verified:
                self.controller.acceptance.record_step(verified)
        else:
            self._unrecorded.extend(verified)

    def prepare_next(self, queued: Optional[list], waiting: int = 0) -> None:
        """Runs once the next step is queued on the device (``queued``: its scheduled requests,
        None if none is): records the outcomes ``committed`` left, then, while drafting,
        decides the k of the step after the queued one from the queued step's rows. A decision
        made by the call before and not applied since is dropped: it was for a step that was
        not planned (the batch drained, every request was aborted)."""
        self._ahead = None
        if self._unrecorded:
            unrecorded, self._unrecorded = self._unrecorded, []
            self.controller.acceptance.record_step(unrecorded)
        ctl = self.controller
        if queued and ctl.current > 0 and self._evaluates():   # drafting: decide ahead
            rows = self._rows(queued)
            if rows:
                ctl.waiting = waiting
                decision = ctl.decide(rows)
                for k in decision.ks:   # counted when applied, to the rows that take it
                    ctl.chosen_counts[k] -= 1
                self._ahead = (ctl, decision)

    def reset(self) -> None:
        """The engine dropped its queued step (every request aborted or failed): no decision
        made ahead, no outcome left to record (their requests are forgotten)."""
        self._ahead = None
        self._unrecorded = []

    def _mark(self, scheduled: list, hold: bool) -> None:
        """One pass over the step: a held step's sampling requests get k = 0 (``hold``), and
        prefill chunks that do not sample feed the draft model only while the batch drafts: at
        k = 0 a prompt's draft KV is left behind (``Row.lag``, priced by the controller when it
        leaves 0). On an H100 the draft's eager forward over a chunk cost ~1.8 ms (4-layer
        draft) to ~12 ms (28 layers) whatever its length, in every step a request arrived, and
        held a load ramp at k = 0 to 0.93x plain decoding."""
        level = not self.at_zero
        for s in scheduled:
            if not s.samples:
                s.draft_level = level
            elif hold:
                s.k_next = 0

    def record(self, scheduled: list) -> None:
        """Feed the acceptance model this step's verifications now (``committed`` may defer
        them)."""
        verified = self._verified(scheduled)
        if verified:
            self.controller.acceptance.record_step(verified)

    def _verified(self, scheduled: list) -> list[tuple[str, int, int, int, int]]:
        """This step's verifications (``k`` drafts, ``num_accepted``), each in the generation
        phase its request was in when the step before decided to propose them (``plan``)."""
        verified = []
        verifying = [s for s in scheduled if s.k and s.samples]   # at k = 0 none: no loop body runs
        for s in verifying:
            req = s.request
            phases = self._phases.get(req.request_id)
            if phases is not None:
                phase = phases[1]
            else:   # (not planned here: a test's step) from the tokens before the step
                phase = self.controller.acceptance.phase(max(0, req.num_output_tokens - s.num_accepted - 1))
            verified.append((req.request_id, self._fixed_part(req)[0], s.k, s.num_accepted, phase))
        return verified

    def forget(self, request_id: str) -> None:
        self.controller.acceptance.forget(request_id)
        self._fixed.pop(request_id, None)
        self._phases.pop(request_id, None)

    def after_step(self, scheduled: list, stats, decision: Optional[Decision] = None) -> None:
        """Fill the step's speculation stats; a decode-only step also refines the cost model.
        ``decision``: the step's own (the controller's last one may already be the next
        step's, planned before this step's stats were complete)."""
        ctl = self.controller
        decision = decision if decision is not None else ctl.last
        counts = [0] * (ctl.k_max + 1)   # one pass: this runs every step over every row
        k_verify = k_draft = sampling = 0
        for s in scheduled:
            if s.samples:
                k = s.k_next
                counts[k] += 1
                sampling += 1
                if k > k_draft:
                    k_draft = k
                if s.k > k_verify:
                    k_verify = s.k
        stats.spec_chosen_k = counts if sampling else []
        if sampling and sampling == len(scheduled) and stats.num_prompt_tokens == 0:
            host = None   # a step read after the next was queued: its host work, hidden
            if stats.host_wait_seconds is not None:
                host = max(0.0, stats.step_seconds - stats.host_wait_seconds)
            ctl.observe_step(sampling, k_verify, k_draft, stats.num_generation_tokens,
                             stats.step_seconds, host, stats.target_seconds)
        if decision is not None:
            stats.spec_predicted_speedup = decision.predicted_speedup
        stats.spec_measured_speedup = ctl.measured_speedup
        self._since_snapshot += 1
        idle = stats.num_running + stats.num_waiting == 0   # a burst's last step: show it now
        if idle or (self._since_snapshot >= self.SNAPSHOT_EVERY
                    and time.monotonic() - self._snapshot_at >= self.SNAPSHOT_SECONDS):
            self._since_snapshot, self._snapshot_at = 0, time.monotonic()
            self.snapshot = self._snapshot()
