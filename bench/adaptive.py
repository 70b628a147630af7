"""Adaptive k (issue 14) measured: decode tokens/s of no speculation, every fixed k and adaptive.

Three pairs share one dummy target: an unrelated dummy draft (acceptance ~0), the target drafting
for itself (acceptance ~1) and a *truncated* draft in between. The truncated draft is the target's
first ``mid_layers`` decoder layers plus its embedding, final norm and LM head, the weights copied
from the loaded target. Random layers each add a term of about the same size to the residual
stream, so a prefix of a random model predicts the whole one poorly; a trained model's later layers
refine rather than rewrite. The target is therefore made that way: its layers from ``mid_layers``
on have their output projections (``o_proj``, ``down_proj``) scaled by ``late_scale`` before any
engine is built. ``late_scale`` sets the acceptance (measured and reported per cell); the draft's
cost ratio is what its bytes say (layers + LM head).

One engine per pair, built with k_max = max(ks) in adaptive mode (start-up calibration included).
A fixed-k run swaps in a controller that forces k for every row (and, with CUDA graphs, a
verification graph of exactly k + 1 tokens per row when the runner has none: what an engine
started with ``--num-speculative-tokens k --speculative-k fixed`` captures); the adaptive
controller, its acceptance estimates and its cost model are left untouched by those runs.
No speculation is a plain engine without a draft.

The ramp: ``ramp_requests`` requests of ``ramp_output_len`` tokens each arrive one by one on a
token clock (request i once the engine has committed about sum_{j<i} j / ramp_rate tokens, i.e.
one arrival per 1/ramp_rate plain decode steps), so the batch climbs from 1 to its peak and, as
they finish first-in first-out, back down to 1. The clock counts committed tokens, so every
configuration sees the same overlap of requests whatever its speed.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import torch

from specserve.bench import shapes
from specserve.bench.engines import (GenerationRun, ModelCache, random_prompts,
                                     run_generation)
from specserve.engine.core import EngineCore
from specserve.engine.spec_control import AcceptanceModel, CostModel, KController
from specserve.engine.types import SamplingParams, SpecDecodeStats, StepStats

# Qwen3-1.7B: 28 layers, hidden 2048, 16 q heads / 8 kv heads of 128, MLP 6144, tied LM head.
QWEN3_17B_LIKE = shapes.ModelShape("qwen3-1.7b-like", 2048, 28, 16, 8, 128, 6144, 151936, True)
QWEN3_4B_LIKE = shapes.ModelShape("qwen3-4b-like", 2560, 36, 32, 8, 128, 9728, 151936, True)
TARGETS = {"1.7b": QWEN3_17B_LIKE, "4b": QWEN3_4B_LIKE}


@dataclass(frozen=True)
class AdaptiveSettings:
    batch_sizes: tuple[int, ...]
    temperatures: tuple[float, ...]
    ks: tuple[int, ...]              # fixed k measured; k_max of the engines = max(ks)
    prompt_len: int
    output_len: int                  # per request, at least
    cell_tokens: int                 # a cell generates at least this many tokens (small batches run longer)
    mid_layers: int
    late_scale: float
    ramp_requests: int
    ramp_output_len: int
    ramp_rate: float                 # arrivals per plain decode step during the climb
    seed: int = 0
    # tokens per request of each config's untimed run of a cell's own prompts before its timed
    # rounds (0: none): a cell's first run at a new batch met first-use costs that the later
    # rounds did not (H100, 2026-12-07: plain and adaptive both read ~0.7x their later runs in
    # the first round at batch 256, T = 0, the first cell at that batch). The adaptive
    # controller also learns from it (k = 0 step times at the new batch, the first phase's
    # outcomes), as it learns from each round before the next: round 1 then starts as the
    # later rounds do.
    cell_warmup_tokens: int = 16

    @property
    def k_max(self) -> int:
        return max(self.ks)

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens of the engines: room for every row's widest verification."""
        return max(2048, max(max(self.batch_sizes), self.ramp_requests) * (self.k_max + 1) + 64)

    def output_len_for(self, batch: int) -> int:
        """Tokens per request in a cell of ``batch``: at least ``output_len`` and
        ``cell_tokens`` in all, and 32 per step the batch's prompts take to prefill. Tokens/s
        counts the decode phase (from the step where every request has its first token); while
        a large batch's prompts prefill over several steps, the requests already admitted
        decode, more of them with speculation than without, and with 32 tokens each at batch
        256 the decode phase of a good draft held only a fifth of the tokens."""
        prefill_steps = -(-batch * self.prompt_len // self.token_budget)
        return max(self.output_len, -(-self.cell_tokens // batch), 32 * prefill_steps)


def script_settings(batch_sizes: Sequence[int], temperatures: Sequence[float],
                    ks: Sequence[int] = tuple(range(1, 9)), output_len: int = 128,
                    **overrides) -> AdaptiveSettings:
    """The settings the trace scripts share (scripts/step_times.py, adaptive_decisions.py,
    held_zero_ab.py, eager_profile.py): the bench's truncated-draft pair (4 layers, late layers
    scaled by 0.05), 32-token prompts and ``output_len`` tokens per request; ``overrides`` replace
    any other field."""
    fields = dict(prompt_len=32, output_len=output_len, cell_tokens=output_len, mid_layers=4,
                  late_scale=0.05, ramp_requests=256, ramp_output_len=128, ramp_rate=2.0)
    fields.update(overrides)
    return AdaptiveSettings(batch_sizes=tuple(batch_sizes), temperatures=tuple(temperatures),
                            ks=tuple(ks), **fields)


# ---- the pairs ---------------------------------------------------------------------------------
def truncated_shape(target: shapes.ModelShape, layers: int) -> shapes.ModelShape:
    return replace(target, name=f"{target.name}-first{layers}", num_layers=layers)


@torch.no_grad()
def soften_late_layers(model, first: int, scale: float) -> int:
    """Scale the residual-stream writes (o_proj, down_proj) of layers ``first..`` by ``scale``."""
    n = 0
    for layer in list(model.layers)[first:]:
        layer.self_attn.o_proj.weight.mul_(scale)
        layer.mlp.down_proj.weight.mul_(scale)
        n += 1
    return n


@torch.no_grad()
def copy_prefix(target, draft) -> int:
    """Copy every parameter of ``draft`` (a truncated target) from the target's same-named one."""
    src = dict(target.named_parameters())
    n = 0
    for name, p in draft.named_parameters():
        p.copy_(src[name])
        n += p.numel()
    return n


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ---- one controller per kind of run --------------------------------------------------------------
@contextlib.contextmanager
def fixed_k(core: EngineCore, k: int, extra_graphs: dict) -> Iterator[KController]:
    """Every row drafts ``k`` (``k`` = 0 is not used: no speculation is the plain engine); the
    verification graph of width k + 1 from ``extra_graphs`` (when there is one) is made visible."""
    ctl = KController(core.spec_control.k_max, "fixed", None)
    ctl.force = lambda row: k
    runner = core.runner
    key = ("target", k + 1)
    added = key in extra_graphs and key not in runner.graphs
    if added:
        runner.graphs[key] = extra_graphs[key]
    try:
        with swapped_controller(core, ctl):
            yield ctl
    finally:
        if added:
            del runner.graphs[key]


# A/B of the controller: a variant runs as config "adaptive:<name>", beside the default adaptive
# controller, with its own acceptance estimates and cost model (same calibration), kept across
# cells and the ramp as the default one's are.
# Each names keyword arguments of AcceptanceModel ("acceptance") and KController ("controller"),
# or asks for the controller held at k = 0 ("hold_at_zero": True).
VARIANTS: dict[str, dict] = {
    # cold acceptance estimates read as they are
    "no-optimism": {"acceptance": {"optimism": 0.0}},
    # an outcome counts half after 128 controller steps
    "aging": {"acceptance": {"half_life": 128.0}},
    # probes from k = 0 on the doubling schedule only, none paid by the evidence
    "schedule-probes": {"controller": {"probe_share_max": 0.0}},
    # every step priced as if finished rows were refilled (no finish_spreads)
    "no-tail-pricing": {"controller": {"tail_pricing": False}},
    # neither: the controller as it was before both (2fbc8f6)
    "no-evidence-no-tail": {"controller": {"probe_share_max": 0.0, "tail_pricing": False}},
    # the generation phases before 2026-11-28: [0, 16), [16, 64), [64, 256), [256, ...)
    "coarse-phases": {"acceptance": {"phases": (16, 64, 256)}},
    # held at k = 0 through the adaptive engine's own path (hold_at_zero): what that path costs
    # beside the plain engine, with no decision to blame
    "held-zero": {"hold_at_zero": True},
}


def variant_controllers(core: EngineCore, names: tuple[str, ...]) -> dict[str, KController]:
    """``{"adaptive:<name>": controller}`` for each variant in ``names`` (see VARIANTS)."""
    base = core.spec_control.controller
    out = {}
    for name in names:
        cost = None if base.cost is None else CostModel(base.cost.cal,
                                                        zero_runs_ahead=base.cost.zero_runs_ahead)
        v = VARIANTS[name]
        acceptance = AcceptanceModel(base.k_max, **v.get("acceptance", {}))
        ctl = KController(base.k_max, "adaptive", cost, acceptance, **v.get("controller", {}))
        if v.get("hold_at_zero"):
            hold_at_zero(ctl)
        out[f"adaptive:{name}"] = ctl
    return out


def hold_at_zero(ctl: KController) -> None:
    """Hold an adaptive controller at k = 0 through its real path (scripts that time the
    adaptive engine's k = 0 steps): nothing looks worth leaving 0 for, and no probe falls due,
    on the schedule or paid by the evidence."""
    ctl.current, ctl.explore_every, ctl.HYSTERESIS, ctl.probe_share_max = 0, 10**9, 1e9, 0.0


@contextlib.contextmanager
def swapped_controller(core: EngineCore, ctl: KController) -> Iterator[KController]:
    sc = core.spec_control
    saved, sc.controller = sc.controller, ctl
    try:
        yield ctl
    finally:
        sc.controller = saved


def capture_exact_widths(core: EngineCore, ks: tuple[int, ...], log: Callable[[str], None]) -> dict:
    """Verification graphs at widths k + 1 the runner lacks (CUDA graphs only), kept aside."""
    runner = core.runner
    base = runner.graphs.get(("target", 1)) if runner.graphs else None
    if base is None:
        return {}
    from specserve.engine.runner.cuda_graphs import GraphedForward

    out, pool = {}, base.pool
    for k in ks:
        q = k + 1
        if ("target", q) in runner.graphs:
            continue
        t0 = time.perf_counter()
        g = GraphedForward(runner.target, runner.target_kv, q, base.buckets[-1],
                           base.block_tables.shape[1], base.max_model_len, runner.block_size,
                           runner.device)
        g.pool = pool
        g.capture()
        pool = g.pool
        out[("target", q)] = g
        log(f"adaptive: verification graph of width {q} for fixed k={k} captured in "
            f"{time.perf_counter() - t0:.1f}s")
    return out


# ---- generation ----------------------------------------------------------------------------------
@dataclass
class CellRun:
    run: GenerationRun
    chosen_k: list[int] = field(default_factory=list)     # histogram over k = 0..k_max (per row-step)
    ahead_steps: int = 0    # decode steps that queued the next step before reading their own

    def as_dict(self) -> dict:
        d = self.run.as_dict()
        d["chosen_k"] = self.chosen_k
        d["ahead_steps"] = self.ahead_steps
        return d


def _params(temperature: float, max_tokens: int) -> SamplingParams:
    # unseeded: seeded sampled requests are pinned to k = 0 by design (docs/speculation.md)
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)


def mean_k(hist: list[int]) -> Optional[float]:
    """The mean of a chosen-k histogram (rows at each k), None if it is empty."""
    n = sum(hist)
    return sum(k * c for k, c in enumerate(hist)) / n if n else None


def _count(hist: list[int], counts: list[int]) -> None:
    """Add a step's sampling requests per chosen k (``StepStats.spec_chosen_k``) to ``hist``."""
    if len(hist) < len(counts):
        hist.extend([0] * (len(counts) - len(hist)))
    for k, n in enumerate(counts):
        hist[k] += n


def generate(core: EngineCore, prompts: list[list[int]], temperature: float, output_len: int,
             tag: str) -> CellRun:
    """All prompts at once, exactly ``output_len`` tokens each; tokens/s of the decode phase and
    the k chosen for each row at each decode step (unseeded, as ``_params``)."""
    chosen: list[int] = []
    ahead = [0, _ahead_count(core)]

    def on_step(stats: StepStats) -> None:
        _count(chosen, stats.spec_chosen_k)
        now = _ahead_count(core)
        ahead[0] += now > ahead[1]
        ahead[1] = now

    run = run_generation(core, prompts, output_len, tag, temperature=temperature, on_decode_step=on_step)
    return CellRun(run, chosen, ahead[0])


def _ahead_count(core: EngineCore) -> int:
    """Steps the engine has queued behind an unread one so far (engine/decode_ahead.py)."""
    return core.decode_ahead.num_ahead_steps if core.decode_ahead is not None else 0


def cell_row(cell: CellRun) -> dict:
    r = cell.run
    return {"tok_per_s": r.decode_tok_per_s, "acceptance_length": r.spec.acceptance_length,
            "decode_steps": r.decode_steps, "decode_tokens": r.decode_tokens,
            "decode_seconds": r.decode_seconds, "chosen_k": cell.chosen_k,
            "ahead_steps": cell.ahead_steps,
            "spec_decode": r.spec.as_dict()}


def conditional_rates(spec: SpecDecodeStats) -> list[float]:
    """a_j = P(position j accepted | 1..j-1 accepted), from a run where every draft had k drafts."""
    out, prev = [], spec.num_drafts
    for n in spec.accepted_per_pos:
        out.append(n / prev if prev else float("nan"))
        prev = n
    return out


# ---- a grid for one engine -----------------------------------------------------------------------
Progress = Callable[[str], None]


def measure_grid(core: EngineCore, s: AdaptiveSettings, label: str, configs: list[str],
                 extra_graphs: dict, progress: Progress, plain_core: Optional[EngineCore] = None,
                 repeats: int = 1, variants: Optional[dict[str, KController]] = None) -> dict:
    """``{config: {temperature: {batch: row}}}`` for configs among "plain", "k<n>", "adaptive"
    and the "adaptive:<name>" keys of ``variants`` (run like adaptive, right after it).

    "plain" runs on ``plain_core`` when given (an engine without a draft), the others on
    ``core``. Each cell first runs every config once over its prompts, untimed
    (``cell_warmup_tokens``; adaptive learns from it too), then ``repeats`` rounds; in each,
    plain and adaptive run first, side by
    side, then every fixed k: on a noisy host a ratio of two runs seconds apart means more than
    one of runs minutes apart. Every config shows its median run, with every run's tok/s in
    ``runs`` (in round order); adaptive adds ``over_plain_runs``, the ratio of each adaptive
    run to the plain run just before it. Fixed k ran once a cell until 2026-11-29, and a cell's
    best fixed k was then the best of five single runs: at T = 1 and batch 1 (128 tokens, ~17
    steps a run) one lucky k = 8 run read 1.10x adaptive's median on an H200."""
    if "plain" in configs and plain_core is None and core.spec_control is not None:
        raise ValueError("measure_grid: 'plain' needs a plain engine (plain_core)")
    vocab = core.info.vocab_size
    out: dict = {c: {} for c in configs}
    engine, paired, order = _run_plan(core, plain_core, configs, repeats)
    warm = random_prompts(min(4, max(s.batch_sizes)), s.prompt_len, vocab, s.seed + 999)

    def untimed(prompts: list[list[int]], t: float, tokens: int, tag: str) -> None:
        for c in configs:
            with _config(engine[c], c, extra_graphs, variants):
                generate(engine[c], prompts, t, tokens, f"{label}-{c}-{tag}")

    for t in s.temperatures:
        untimed(warm, t, 8, f"warm-{t}")   # a short warm-up per configuration and temperature
        for b in s.batch_sizes:
            prompts = random_prompts(b, s.prompt_len, vocab, s.seed + 1000 * b)
            n = s.output_len_for(b)
            if s.cell_warmup_tokens > 0:
                untimed(prompts, t, s.cell_warmup_tokens, f"{t}-{b}-warm")
            runs: dict[str, list[dict]] = {c: [] for c in configs}
            for i, c in enumerate(order):
                with _config(engine[c], c, extra_graphs, variants):
                    cell = generate(engine[c], prompts, t, n, f"{label}-{c}-{t}-{b}-{i}")
                runs[c].append(cell_row(cell))
            for c in configs:
                out[c].setdefault(t, {})[b] = _median_row(runs[c])
            for c in paired:
                _pair_with_plain(out[c][t][b], runs, c)
            ahead = "; ".join(f"{c} {out[c][t][b]['ahead_steps']}/{out[c][t][b]['decode_steps']}"
                              for c in paired)
            progress(f"adaptive {label} T={t:g} batch {b} ({n} tok/request): "
                     + ", ".join(f"{c} {_fmt(out[c][t][b]['tok_per_s'])}" for c in configs)
                     + f" (decode steps that queued the next: {ahead})")
    return out


def _run_plan(core: EngineCore, plain_core: Optional[EngineCore], configs: list[str],
              repeats: int) -> tuple[dict[str, EngineCore], list[str], list[str]]:
    """(the engine of each config, the configs run side by side, the order of the runs):
    "plain" on ``plain_core`` when given; ``repeats`` rounds, each with plain, adaptive and its
    variants first, then every other config."""
    engine = {c: plain_core if c == "plain" and plain_core is not None else core for c in configs}
    paired = [c for c in configs if c == "plain" or c.startswith("adaptive")]
    rest = [c for c in configs if c not in paired]
    return engine, paired, (paired + rest) * repeats


def _pair_with_plain(row: dict, runs: dict[str, list[dict]], config: str) -> None:
    """``over_plain_runs`` of an adaptive config's row: each of its runs over the plain run of
    the same round."""
    if config != "plain" and "plain" in runs:
        row["over_plain_runs"] = [a["tok_per_s"] / p["tok_per_s"] if a["tok_per_s"] and p["tok_per_s"]
                                  else None for p, a in zip(runs["plain"], runs[config])]


def _median_row(runs: list[dict]) -> dict:
    """The run with the median tok/s (the lower middle one of an even count), with every run's
    tok/s under ``runs``."""
    ranked = sorted(runs, key=lambda r: r["tok_per_s"] or 0.0)
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["runs"] = [r["tok_per_s"] for r in runs]
    return row


@contextlib.contextmanager
def _config(core: EngineCore, config: str, extra_graphs: dict,
            variants: Optional[dict[str, KController]] = None) -> Iterator[None]:
    if config.startswith("k"):
        with fixed_k(core, int(config[1:]), extra_graphs):
            yield
    elif variants and config in variants:
        with swapped_controller(core, variants[config]):
            yield
    else:
        yield


# ---- the ramp ------------------------------------------------------------------------------------
def ramp_arrivals(s: AdaptiveSettings) -> list[float]:
    """Token-clock threshold of each arrival: one per 1/ramp_rate plain steps at the current batch."""
    out, clock = [], 0.0
    for i in range(s.ramp_requests):
        out.append(clock)
        clock += (i + 1) / s.ramp_rate
    return out


def warm_ramp_settings(s: AdaptiveSettings) -> AdaptiveSettings:
    """A short ramp run once per config before the timed ones: mixed prefill + decode steps
    appear only in the ramp, so their kernels compile here, not inside a timed run."""
    return replace(s, ramp_requests=max(2, s.ramp_requests // 8),
                   ramp_output_len=min(16, s.ramp_output_len))


def run_ramp(core: EngineCore, s: AdaptiveSettings, temperature: float, tag: str) -> dict:
    """Staggered arrivals, fixed lengths, first in first out: the batch goes 1 -> peak -> 1."""
    vocab = core.info.vocab_size
    prompts = random_prompts(s.ramp_requests, s.prompt_len, vocab, s.seed + 4242)
    arrivals = ramp_arrivals(s)
    params = _params(temperature, s.ramp_output_len)
    nxt, tokens, steps = 0, 0, 0
    trace: list[tuple[float, int, int, int]] = []   # (seconds, running, batch k, queued the next 0/1)
    chosen: list[int] = []
    spec = SpecDecodeStats()
    t0 = time.perf_counter()
    while nxt < len(prompts) or core.has_unfinished():
        while nxt < len(prompts) and (arrivals[nxt] <= tokens or not core.has_unfinished()):
            core.add_request(f"{tag}-{nxt}", prompts[nxt], params, final_only=True)   # as run_generation
            nxt += 1
        queued = _ahead_count(core)
        _, stats = core.step()
        steps += 1
        tokens += stats.num_generation_tokens
        spec.merge(stats.spec_decode)
        _count(chosen, stats.spec_chosen_k)
        trace.append((time.perf_counter() - t0, stats.num_running,
                      stats.max_chosen_k, int(_ahead_count(core) > queued)))
    seconds = time.perf_counter() - t0
    peak = max((r for _, r, _, _ in trace), default=0)
    return {"tok_per_s": tokens / seconds if seconds > 0 else None, "tokens": tokens,
            "seconds": seconds, "steps": steps, "peak_batch": peak,
            "acceptance_length": spec.acceptance_length, "chosen_k": chosen,
            "ahead_steps": sum(a for *_, a in trace),
            "trace": [[round(t, 4), r, k, a] for t, r, k, a in trace[::max(1, len(trace) // 400)]]}


def measure_ramp(core: EngineCore, s: AdaptiveSettings, configs: list[str], extra_graphs: dict,
                 temperature: float, label: str, progress: Progress,
                 variants: Optional[dict[str, KController]] = None,
                 plain_core: Optional[EngineCore] = None, repeats: int = 1) -> dict:
    """``{config: ramp}``; like ``measure_grid``, "plain" runs on ``plain_core``, and plain,
    adaptive and the variants run first side by side, then every fixed k, all of it ``repeats``
    times: the ramp's goal is against the best fixed k, and on an H100 three no-spec ramps of
    one call read 24,170, 26,130 and 19,920 tok/s, so one run of each fixed k could not say
    which was best or by how much. A config shows its median run, with every run's tok/s in
    ``runs`` and, for adaptive and the variants, ``over_plain_runs``."""
    engine, paired, order = _run_plan(core, plain_core, configs, repeats)
    warm = warm_ramp_settings(s)
    for c in configs:
        with _config(engine[c], c, extra_graphs, variants):
            run_ramp(engine[c], warm, temperature, f"{label}-ramp-warm-{c}")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for i, c in enumerate(order):
        with _config(engine[c], c, extra_graphs, variants):
            r = run_ramp(engine[c], s, temperature, f"{label}-ramp-{c}-{i}")
        runs[c].append(r)
        progress(f"adaptive ramp {label} {c}: {_fmt(r['tok_per_s'])} tok/s over {r['seconds']:.1f}s, "
                 f"peak batch {r['peak_batch']}, {r['ahead_steps']} of {r['steps']} steps queued the next")
    out = {c: _median_row(runs[c]) for c in configs}
    for c in paired:
        _pair_with_plain(out[c], runs, c)
    return out


# ---- engines -------------------------------------------------------------------------------------
def kv_blocks(s: AdaptiveSettings, block_size: int = 16) -> int:
    """Blocks for the largest simultaneous load: a grid cell or the ramp's peak (explicit, so
    several engines can coexist without sizing their caches from free memory)."""
    def per(output_len: int) -> int:
        return -(-(s.prompt_len + output_len + 2 * (s.k_max + 1)) // block_size) + 1

    need = [b * per(s.output_len_for(b)) for b in s.batch_sizes]
    need.append(s.ramp_requests * per(s.ramp_output_len))
    return max(need) + 8


def build_core(cache: ModelCache, target: str, draft: Optional[str], s: AdaptiveSettings) -> EngineCore:
    max_seqs = max(max(s.batch_sizes), s.ramp_requests)
    return cache.core(target, draft, s.k_max if draft else 0, kv_blocks(s), "dummy",
                      max_num_seqs=max_seqs, max_num_batched_tokens=s.token_budget,
                      speculative_k="adaptive")


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:,.1f}"


@dataclass
class PairModels:
    """The section's models, loaded into a ModelCache: the softened target and both drafts."""

    target: torch.nn.Module
    mid: torch.nn.Module          # the truncated draft: the target's first layers, copied
    unrelated: torch.nn.Module
    softened_layers: int


def load_pair_models(cache: ModelCache, dirs: dict[str, str], s: AdaptiveSettings,
                     seed: int) -> PairModels:
    """Load the target (its late layers softened), the truncated draft (the target's prefix
    copied in) and the unrelated draft into ``cache``; engines then share them by directory."""
    target = cache.model(dirs["target"], "dummy", seed)
    softened = soften_late_layers(target, s.mid_layers, s.late_scale)
    mid = cache.model(dirs["mid"], "dummy", seed + 2)
    copy_prefix(target, mid)
    unrelated = cache.model(dirs["unrelated"], "dummy", seed + 1)
    return PairModels(target, mid, unrelated, softened)


def script_models(root: Path, s: AdaptiveSettings, tiny: bool) -> tuple[dict[str, str], ModelCache]:
    """The section's checkpoints and loaded models for a script (scripts/adaptive_decisions.py,
    scripts/eager_profile.py): the 1.7B-like target and its drafts in bf16 on CUDA, or tiny
    fp32 shapes on the CPU (a smoke run)."""
    tshape, dshape = (shapes.TINY_TARGET, shapes.TINY_DRAFT) if tiny else \
        (TARGETS["1.7b"], shapes.QWEN3_06B_LIKE)
    dirs = model_dirs(root, tshape, dshape, s.mid_layers)
    cache = ModelCache("cpu" if tiny else "cuda", "float32" if tiny else "bfloat16", "auto",
                       1024, False, 0)
    load_pair_models(cache, dirs, s, seed=0)
    return dirs, cache


def model_dirs(root: Path, target: shapes.ModelShape, draft: shapes.ModelShape,
               mid_layers: int) -> dict[str, str]:
    """Checkpoint directories (no weights) of the target, the unrelated draft and the truncated
    draft, sharing one tokenizer."""
    tok = shapes.build_tokenizer(target.vocab_size)
    mid = truncated_shape(target, mid_layers)
    return {"target": str(shapes.write_checkpoint(root / target.name, target, tok)),
            "unrelated": str(shapes.write_checkpoint(root / draft.name, draft, tok)),
            "mid": str(shapes.write_checkpoint(root / mid.name, mid, tok))}
