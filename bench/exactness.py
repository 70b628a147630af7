"""Exactness of the rejection sampler at production shapes: acceptance against exact theory.

    python -m specserve.bench.exactness --out DIR                 # GPU: the full grid (Triton)
    python -m specserve.bench.exactness --out DIR --device cpu --quick   # CPU: small shapes (torch twin)

A *cell* is one verification problem: B requests, k drafts each, vocabulary V, logits dtype,
temperature, top-k / top-p, and a verification mode. Its logits are drawn once (seeded) and stay
fixed; each *repeat* draws fresh seeds, samples the k drafts with ``sample_draft`` and verifies
them with ``rejection_sample``, exactly as an engine step does. Repeats run until the cell has
``rows`` requests (100,000 by default), as a CUDA graph on the GPU.

What is compared, per cell, against theory computed in fp64 (never sampled):

* **Acceptance per draft position.** For request b and position i, given the tokens actually
  drafted and that every earlier draft was accepted, the sampler accepts x_i with probability
  ``a_i = min(1, p_i(x_i) / q_i(x_i))`` (probabilistic), or ``p_i(x_i)`` (strict verification, and
  greedy drafts, whose q is one-hot). p comes from an fp64 re-implementation of the sampling
  filters on the same logits; q is the draft probability row the sampler stored and used.
  Summed over requests and repeats that reached position i, the accepted count has an exact
  expectation (sum of a_i) and variance (sum of a_i (1 - a_i)): ``z = (observed - E) / sd``.
* **The token emitted at the first rejection** must follow the normalised residual
  ``max(p - q, 0)`` (p without the draft token for strict and greedy drafts), and the **bonus
  token** after k acceptances must follow p. Each is a Pearson chi-square over categories pooled
  across rows: the row's 16 most likely tokens by rank, then the rest of the vocabulary in 64
  ranges of token ids (so losing a range of the vocabulary shows), categories with expectation
  under 5 merged.

Tolerances (the GPU test's): every |z| < 4 and every chi-square p > 1e-4.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

import torch

from specserve.engine.runner.cuda_graphs import collector_paused

MODES = ("probabilistic", "strict", "greedy_draft")
TOP_TOKENS = 16        # categories: the row's most likely tokens, by rank
VOCAB_RANGES = 64      # ...and the remaining vocabulary split into ranges of token ids
Z_LIMIT = 4.0
CHI2_P_LIMIT = 1e-4


@dataclass(frozen=True)
class Cell:
    """One verification problem (fixed logits) and how many requests to verify in total."""

    vocab: int = 151_936
    dtype: str = "bfloat16"
    batch: int = 64
    k: int = 3
    temperature: float = 1.0
    top_k: int = 0             # 0: off
    top_p: float = 1.0         # 1: off
    mode: str = "probabilistic"
    draft_noise: float = 1.0   # draft logits = target logits + N(0, draft_noise^2)
    rows: int = 100_000        # requests verified in all (batch x repeats)
    seed: int = 0

    @property
    def name(self) -> str:
        filt = "" if self.top_k <= 0 and self.top_p >= 1 else f" top_k={self.top_k} top_p={self.top_p}"
        noise = "" if self.draft_noise == 1.0 else f" noise={self.draft_noise}"
        return (f"V={self.vocab} {self.dtype} B={self.batch} k={self.k} T={self.temperature}"
                f"{filt} {self.mode}{noise}")

    @property
    def repeats(self) -> int:
        return math.ceil(self.rows / self.batch)


@dataclass
class CellResult:
    cell: Cell
    repeats: int
    seconds: float
    accepted: list[float]          # per position: observed acceptances among requests reaching it
    expected: list[float]          # exact expectation
    variance: list[float]
    reached: list[float]
    z: list[float]
    residual_chi2: float
    residual_df: int
    residual_p: float
    residual_events: float
    bonus_chi2: float
    bonus_df: int
    bonus_p: float
    bonus_events: float
    max_q_error: float             # |q stored by sample_draft - q in fp64|, largest
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (all(abs(z) < Z_LIMIT for z in self.z) and self.residual_p > CHI2_P_LIMIT
                and self.bonus_p > CHI2_P_LIMIT)

    def to_json(self) -> dict:
        d = asdict(self)
        d["cell"]["name"] = self.cell.name
        d["passed"] = self.passed
        return d


# ----------------------------------------------------------------------------- theory (fp64)

def filtered_probs64(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The sampling distribution of each row, in fp64, written independently of the kernels:
    softmax of z / T; top-k keeps values at or above the k-th largest (ties kept); top-p keeps,
    among those, values at or above the largest threshold whose kept mass reaches top_p of the
    top-k survivors' mass (ties kept). T == 0 is not a sampled row and is not handled here."""
    x = logits.to(torch.float64) / temperature
    e = torch.exp(x - x.amax(dim=1, keepdim=True))                         # [N, V]
    v = e.shape[1]
    if 0 < top_k < v:
        kth = torch.topk(e, top_k, dim=1).values[:, -1:]
        e = torch.where(e >= kth, e, 0.0)
    if top_p < 1.0:
        srt = torch.sort(e, dim=1, descending=True).values
        csum = torch.cumsum(srt, dim=1)
        need = top_p * csum[:, -1:]
        first = torch.searchsorted(csum, need).clamp(max=v - 1)             # first prefix >= need
        thr = srt.gather(1, first)
        e = torch.where(e >= thr, e, 0.0)
    return e / e.sum(dim=1, keepdim=True)


def _categories(dist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-token ids [N, M] and the mass of each category [N, M + R] of rows of ``dist`` [N, V]."""
    n, v = dist.shape
    top = torch.topk(dist, TOP_TOKENS, dim=1)
    rest = dist.scatter(1, top.indices, 0.0)
    bucket = torch.arange(v, device=dist.device) * VOCAB_RANGES // v
    ranges = torch.zeros(n, VOCAB_RANGES, dtype=dist.dtype, device=dist.device).index_add_(1, bucket, rest)
    return top.indices, torch.cat([top.values, ranges], dim=1)


def _category_of(tokens: torch.Tensor, top_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Category of each token in its row: rank among the row's top tokens, else its id range."""
    hit = top_ids == tokens.unsqueeze(1)                                     # [N, M]
    rank = torch.argmax(hit.to(torch.int8), dim=1)
    return torch.where(hit.any(dim=1), rank, TOP_TOKENS + tokens * VOCAB_RANGES // vocab)


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float]:
    """Pearson chi-square of counts against expectations [C]; categories whose expectation is
    under 5 are merged into one (into the smallest kept category if that one is still under 5).
    Returns (statistic, degrees of freedom, p-value)."""
    o, e = observed.double().cpu(), expected.double().cpu()
    small = e < 5
    if small.any():
        o_s, e_s = o[small].sum(), e[small].sum()
        o, e = o[~small], e[~small]
        if e_s >= 5 or len(e) == 0:
            o, e = torch.cat([o, o_s.view(1)]), torch.cat([e, e_s.view(1)])
        elif e_s > 0:
            i = int(torch.argmin(e))
            o[i] += o_s
            e[i] += e_s
    if len(e) < 2:
        return 0.0, 0, 1.0
    stat = float(((o - e) ** 2 / e).sum())
    df = len(e) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p


# ----------------------------------------------------------------------------- the problem

class Problem:
    """The fixed logits, per-request parameters and fp64 theory tables of one cell."""

    def __init__(self, cell: Cell, device: torch.device, ops: ModuleType):
        self.cell, self.device, self.ops = cell, device, ops
        b, k, v = cell.batch, cell.k, cell.vocab
        g = torch.Generator(device=device).manual_seed(cell.seed)
        self.target_logits = _zipf_logits(b * (k + 1), v, g, device).to(_dtype(cell.dtype))
        t_rows = self.target_logits.view(b, k + 1, v)[:, :k].reshape(b * k, v).float()
        noise = torch.randn(b * k, v, generator=g, device=device) * cell.draft_noise
        self.draft_logits = (t_rows + noise).to(_dtype(cell.dtype))         # [B * k, V]
        self.positions = torch.randint(0, 1 << 20, (b,), generator=g, device=device)
        self.seed_base = int(torch.randint(1, 1 << 40, (1,), generator=g, device=device))
        f32 = dict(dtype=torch.float32, device=device)
        self.temperature = torch.full((b,), cell.temperature, **f32)
        self.top_k = torch.full((b,), cell.top_k, dtype=torch.int32, device=device)
        self.top_p = torch.full((b,), cell.top_p, **f32)
        self.min_p = torch.zeros(b, **f32)
        self.cu = torch.arange(0, b * k + 1, k, dtype=torch.int32, device=device)
        rep = lambda t: t.repeat_interleave(k)                               # noqa: E731
        self.draft_params = (rep(self.temperature), rep(self.top_k), rep(self.top_p), rep(self.min_p))
        self.draft_positions = (self.positions.view(b, 1) + torch.arange(k, device=device)).view(-1)
        self._theory()

    def _theory(self) -> None:
        c, b, k, v = self.cell, self.cell.batch, self.cell.k, self.cell.vocab
        p = filtered_probs64(self.target_logits, c.temperature, c.top_k, c.top_p).view(b, k + 1, v)
        self.p_draft_rows = p[:, :k].reshape(b * k, v).contiguous()          # [B * k, V] fp64
        bonus = p[:, k].contiguous()                                         # [B, V]
        self.bonus_top, self.bonus_cat = _categories(bonus)
        self.max_q_error = 0.0
        self.q = None
        if c.mode == "greedy_draft":
            self.greedy_drafts = torch.argmax(self.draft_logits.float(), dim=1)
        else:
            seeds = torch.full((b * k,), self.seed_base, dtype=torch.int64, device=self.device)
            _, q = self.ops.sample_draft(self.draft_logits, *self.draft_params, seeds,
                                         self.draft_positions, True)
            q64 = filtered_probs64(self.draft_logits, c.temperature, c.top_k, c.top_p)
            self.max_q_error = float((q.double() - q64).abs().max())
            self.q = q.double()                                              # the q the sampler uses
        if c.mode == "probabilistic":
            res = torch.clamp(self.p_draft_rows - self.q, min=0.0)
            total = res.sum(dim=1, keepdim=True)
            res = torch.where(total > 0, res / total.clamp(min=1e-300), self.p_draft_rows)
            self.res_top, self.res_cat = _categories(res)
        else:
            self.res_top, self.res_cat = _categories(self.p_draft_rows)


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


def _zipf_logits(n: int, v: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """Rows shaped like a language model's: Zipf(1.1) over a random order of the vocabulary
    (top token ~15-25%), plus N(0, 0.5^2) jitter. [n, V] fp32."""
    ranks = torch.argsort(torch.rand(n, v, generator=g, device=device), dim=1).float() + 1.0
    return -1.1 * torch.log(ranks) + 0.5 * torch.randn(n, v, generator=g, device=device)


# ----------------------------------------------------------------------------- one repeat

class Accumulator:
    """Device-side sums over repeats (no host read until the end)."""

    def __init__(self, k: int, device: torch.device):
        z = lambda *s: torch.zeros(*s, dtype=torch.float64, device=device)  # noqa: E731
        self.accepted, self.expected, self.variance, self.reached = z(k), z(k), z(k), z(k)
        ncat = TOP_TOKENS + VOCAB_RANGES
        self.res_obs, self.res_exp, self.bonus_obs, self.bonus_exp = z(ncat), z(ncat), z(ncat), z(ncat)


class Repeat:
    """One verification of the whole batch with fresh seeds, and its statistics added to an
    :class:`Accumulator`. Static tensors only, so it can be captured in a CUDA graph."""

    def __init__(self, pb: Problem, acc: Accumulator):
        self.pb, self.acc = pb, acc
        b, k = pb.cell.batch, pb.cell.k
        dev = pb.device
        self.seeds = pb.seed_base + torch.arange(b, dtype=torch.int64, device=dev)
        self.draft_seeds = self.seeds.repeat_interleave(k)
        self.pos_i = torch.arange(k, device=dev)
        self.row_base = torch.arange(b, device=dev) * k

    def __call__(self) -> None:
        pb, acc, c = self.pb, self.acc, self.pb.cell
        b, k, v = c.batch, c.k, c.vocab
        if c.mode == "greedy_draft":
            drafts, q = pb.greedy_drafts, None
        else:
            drafts, q = pb.ops.sample_draft(pb.draft_logits, *pb.draft_params, self.draft_seeds,
                                            pb.draft_positions, c.mode == "probabilistic")
        method = "strict" if c.mode == "strict" else "probabilistic"
        out = pb.ops.rejection_sample(pb.target_logits, pb.cu, drafts, q, pb.temperature, pb.top_k,
                                      pb.top_p, pb.min_p, self.seeds, pb.positions, method,
                                      max_num_draft_tokens=k)                 # [B, k + 1]
        n_acc = (out >= 0).sum(dim=1) - 1                                     # [B]
        rows = self.row_base.unsqueeze(1) + self.pos_i                        # [B, k] draft rows
        x = drafts.view(b, k)
        px = pb.p_draft_rows.view(-1)[rows * v + x]                           # [B, k] fp64
        if c.mode == "probabilistic":
            qx = pb.q.view(-1)[rows * v + x]
            a = torch.where(qx > 0, torch.clamp(px / qx.clamp(min=1e-300), max=1.0), 0.0)
        else:
            a = px
        reached = (n_acc.unsqueeze(1) >= self.pos_i).double()                 # [B, k]
        accepted = (n_acc.unsqueeze(1) > self.pos_i).double()
        acc.accepted += accepted.sum(0)
        acc.reached += reached.sum(0)
        acc.expected += (reached * a).sum(0)
        acc.variance += (reached * a * (1 - a)).sum(0)
        self._emitted(out, n_acc, x, rows)

    def _emitted(self, out, n_acc, x, rows) -> None:
        pb, acc, c = self.pb, self.acc, self.pb.cell
        k, v = c.k, c.vocab
        tok = out.gather(1, n_acc.unsqueeze(1)).squeeze(1)                   # [B]
        bonus = (n_acc == k).double()
        # the bonus token: categories of the bonus row's p
        cat_b = _category_of(tok, pb.bonus_top, v)
        acc.bonus_obs.index_add_(0, cat_b, bonus)
        acc.bonus_exp += (pb.bonus_cat * bonus.unsqueeze(1)).sum(0)
        # the token at the first rejection
        j = n_acc.clamp(max=k - 1)
        r = rows.gather(1, j.unsqueeze(1)).squeeze(1)                         # [B] draft row
        rej = 1.0 - bonus
        top = pb.res_top[r]
        acc.res_obs.index_add_(0, _category_of(tok, top, v), rej)
        exp = pb.res_cat[r]                                                   # [B, C]
        if c.mode != "probabilistic":
            # p without the rejected draft token, renormalised
            xr = x.gather(1, j.unsqueeze(1)).squeeze(1)
            pxr = pb.p_draft_rows.view(-1)[r * v + xr]
            onehot = torch.zeros_like(exp).scatter_(1, _category_of(xr, top, v).unsqueeze(1),
                                                    pxr.unsqueeze(1))
            exp = (exp - onehot) / (1 - pxr).clamp(min=1e-300).unsqueeze(1)
        acc.res_exp += (exp * rej.unsqueeze(1)).sum(0)

    def advance(self) -> None:
        """Fresh seeds for the next repeat (every request of every repeat has its own seed)."""
        self.seeds += self.pb.cell.batch
        self.draft_seeds += self.pb.cell.batch


# ----------------------------------------------------------------------------- a cell

def run_cell(cell: Cell, device: torch.device, ops: ModuleType, use_graph: Optional[bool] = None,
             log: Callable[[str], None] = lambda s: None) -> CellResult:
    """Verify ``cell.rows`` requests and compare with theory."""
    t0 = time.perf_counter()
    pb = Problem(cell, device, ops)
    acc = Accumulator(cell.k, device)
    step = Repeat(pb, acc)
    repeats = cell.repeats
    use_graph = device.type == "cuda" if use_graph is None else use_graph
    if use_graph:
        run = _graph_runner(step, acc)
        done = 1                               # the warm-up repeat counts
    else:
        run, done = None, 0
    for _ in range(done, repeats):
        if run is None:
            step()
            step.advance()
        else:
            run.replay()
    res = _result(cell, acc, repeats, time.perf_counter() - t0, pb.max_q_error)
    log(f"{'ok  ' if res.passed else 'FAIL'} {cell.name}: z {_fmt(res.z)}, residual p "
        f"{res.residual_p:.3g}, bonus p {res.bonus_p:.3g} ({res.seconds:.1f} s)")
    return res


def _graph_runner(step: Repeat, acc: Accumulator) -> "torch.cuda.CUDAGraph":
    """Warm up (one repeat, counted), then capture repeat + advance as one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
        step.advance()
    torch.cuda.current_stream().wait_stream(s)
    saved = [t.clone() for t in _acc_tensors(acc)]
    g = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(g):
        step()
        step.advance()
    # capture does not execute: the sums still hold the warm-up repeat only
    for t, keep in zip(_acc_tensors(acc), saved):
        t.copy_(keep)
    return g


def _acc_tensors(acc: Accumulator) -> list[torch.Tensor]:
    return [acc.accepted, acc.expected, acc.variance, acc.reached, acc.res_obs, acc.res_exp,
            acc.bonus_obs, acc.bonus_exp]


def _result(cell: Cell, acc: Accumulator, repeats: int, seconds: float, max_q_error: float) -> CellResult:
    obs, exp, var = acc.accepted.cpu(), acc.expected.cpu(), acc.variance.cpu()
    z = [float((o - e) / math.sqrt(vv)) if vv > 0 else (0.0 if abs(o - e) < 1e-9 else math.inf)
         for o, e, vv in zip(obs.tolist(), exp.tolist(), var.tolist())]
    rs, rdf, rp = chi_square(acc.res_obs, acc.res_exp)
    bs, bdf, bp = chi_square(acc.bonus_obs, acc.bonus_exp)
    return CellResult(cell, repeats, seconds, obs.tolist(), exp.tolist(), var.tolist(),
                      acc.reached.cpu().tolist(), z, rs, rdf, rp, float(acc.res_obs.sum()), bs, bdf,
                      bp, float(acc.bonus_obs.sum()), max_q_error)


def _fmt(z: list[float]) -> str:
    return "[" + ", ".join(f"{v:+.2f}" for v in z) + "]"


# ----------------------------------------------------------------------------- the grids

def shape_grid(rows: int = 100_000) -> list[Cell]:
    """V = 151,936 bf16, T = 1, probabilistic: every B x k of the issue."""
    return [Cell(batch=b, k=k, rows=rows, seed=10 + i)
            for i, (b, k) in enumerate((b, k) for b in (1, 8, 64, 256) for k in (1, 3, 5, 8))]


def parameter_grid(rows: int = 100_000, batch: int = 64, k: int = 3,
                   vocabs: tuple[int, ...] = (32_000, 151_936)) -> list[Cell]:
    """Every vocabulary x dtype x temperature x filter x mode at one (B, k)."""
    cells = []
    for v in vocabs:
        for dt in ("bfloat16", "float32"):
            for t in (0.6, 1.0, 2.0):
                for top_k, top_p in ((0, 1.0), (50, 0.9)):
                    for mode in MODES:
                        cells.append(Cell(vocab=v, dtype=dt, batch=batch, k=k, temperature=t,
                                          top_k=top_k, top_p=top_p, mode=mode, rows=rows,
                                          seed=100 + len(cells)))
    return cells


def near_copy_cells(rows: int = 100_000, vocab: int = 151_936) -> list[Cell]:
    """A draft that nearly equals the target (logit noise 0.001, fp32): acceptance ~0.9995, so
    the few rejections are decided by tiny differences of p and q. Sensitive to precision loss."""
    return [Cell(vocab=vocab, dtype="float32", batch=256, k=8, draft_noise=0.001, rows=rows, seed=900)]


def full_grid(rows: int = 100_000) -> list[Cell]:
    return shape_grid(rows) + parameter_grid(rows) + near_copy_cells(rows)


def quick_grid(rows: int = 20_000) -> list[Cell]:
    """CPU-sized: V = 512, a few cells covering the modes, filters and temperatures."""
    cells = [Cell(vocab=512, dtype="float32", batch=b, k=k, rows=rows, seed=i)
             for i, (b, k) in enumerate([(8, 1), (64, 3), (64, 8)])]
    for i, (t, top_k, top_p, mode) in enumerate([(0.6, 0, 1.0, "strict"), (2.0, 50, 0.9, "probabilistic"),
                                                  (1.0, 50, 0.9, "greedy_draft")]):
        cells.append(Cell(vocab=512, dtype="float32", batch=64, k=3, temperature=t, top_k=top_k,
                          top_p=top_p, mode=mode, rows=rows, seed=50 + i))
    return cells


# ----------------------------------------------------------------------------- report

def write_report(results: list[CellResult], out: Path, command: str, device_name: str,
                 with_plot: bool = True, breakages: Optional[dict[str, CellResult]] = None) -> None:
    """exactness.{json,md,png} in ``out``; ``breakages``: deliberately broken samplers' results."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "device": device_name, "z_limit": Z_LIMIT, "chi2_p_limit": CHI2_P_LIMIT,
           "cells": [r.to_json() for r in results],
           "breakages": {k: r.to_json() for k, r in (breakages or {}).items()}}
    (out / "exactness.json").write_text(json.dumps(doc, indent=1))
    (out / "exactness.md").write_text(markdown(doc))
    if with_plot:
        try:
            plot(doc, out / "exactness.png")
        except ImportError:
            pass


def markdown(doc: dict) -> str:
    cells = doc["cells"]
    bad = [c for c in cells if not c["passed"]]
    zs = [z for c in cells for z in c["z"]]
    lines = [f"# Rejection sampler vs exact theory ({doc['device']})", "",
             f"Command: `{doc['command']}`", "",
             f"{len(cells)} cells, {len(cells) - len(bad)} pass (|z| < {doc['z_limit']:g} at every "
             f"draft position, chi-square p > {doc['chi2_p_limit']:g} for the token at the first "
             f"rejection and for the bonus token). z over all {len(zs)} (cell, position) pairs: "
             f"min {min(zs):+.2f}, max {max(zs):+.2f}.", "",
             "| cell | rows | accepted / expected per position | z per position | residual chi2 (df, p) "
             "| bonus chi2 (df, p) | max abs q error | |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        ratio = ", ".join(f"{o / e:.4f}" if e > 0 else "-" for o, e in zip(c["accepted"], c["expected"]))
        lines.append(
            f"| {c['cell']['name']} | {c['repeats'] * c['cell']['batch']:,} | {ratio} | "
            f"{_fmt(c['z'])} | {c['residual_chi2']:.1f} ({c['residual_df']}, {c['residual_p']:.3g}) | "
            f"{c['bonus_chi2']:.1f} ({c['bonus_df']}, {c['bonus_p']:.3g}) | {c['max_q_error']:.1e} | "
            f"{'ok' if c['passed'] else '**FAIL**'} |")
    if doc.get("breakages"):
        lines += ["", "Deliberately broken samplers (each must fail):", "",
                  "| breakage | cell | z per position | residual p | bonus p | detected |",
                  "|---|---|---|---|---|---|"]
        for name, c in doc["breakages"].items():
            lines.append(f"| {name} | {c['cell']['name']} | {_fmt(c['z'])} | {c['residual_p']:.3g} | "
                         f"{c['bonus_p']:.3g} | {'no' if c['passed'] else 'yes'} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, c in enumerate(doc["cells"]):
        ax1.scatter([i] * len(c["z"]), c["z"], s=8, c=range(len(c["z"])), cmap="viridis", vmin=0, vmax=8)
    ax1.axhspan(-doc["z_limit"], doc["z_limit"], color="tab:green", alpha=0.08)
    ax1.set_xlabel("cell")
    ax1.set_ylabel("z (accepted - exact expectation) / sd")
    ax1.set_title("acceptance per draft position (colour: position)")
    for key, marker in (("residual_p", "o"), ("bonus_p", "^")):
        ax2.scatter(range(len(doc["cells"])), [max(c[key], 1e-300) for c in doc["cells"]], s=10,
                    marker=marker, label=key.replace("_p", ""))
    ax2.axhline(doc["chi2_p_limit"], color="tab:red", lw=1)
    ax2.set_yscale("log")
    ax2.set_xlabel("cell")
    ax2.set_ylabel("chi-square p-value")
    ax2.set_title("emitted token at first rejection / bonus")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Acceptance and emitted tokens of the rejection sampler "
                                 "against exact fp64 theory, over a grid of production shapes.")
    ap.add_argument("--out", type=Path, required=True, help="folder for exactness.{json,md,png}")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--backend", default=None, choices=["torch", "triton"],
                    help="kernel twin to check (default: triton on cuda, torch on cpu)")
    ap.add_argument("--rows", type=int, default=None, help="requests per cell (default 100,000; "
                    "20,000 with --quick)")
    ap.add_argument("--quick", action="store_true", help="the small CPU grid (V = 512)")
    ap.add_argument("--grid", default="full", choices=["full", "shapes", "params", "near_copy"])
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    backend = args.backend or ("triton" if device.type == "cuda" else "torch")
    ops = _backend_module(backend)
    if args.quick:
        cells = quick_grid(args.rows or 20_000)
    else:
        rows = args.rows or 100_000
        cells = {"full": full_grid, "shapes": shape_grid, "params": parameter_grid,
                 "near_copy": near_copy_cells}[args.grid](rows)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"exactness: {len(cells)} cells on {name} ({backend} kernels)", flush=True)
    results = []
    for i, cell in enumerate(cells):
        results.append(run_cell(cell, device, ops, log=lambda s: print(f"[{i + 1}/{len(cells)}] {s}", flush=True)))
        write_report(results, args.out, " ".join(["python -m specserve.bench.exactness", *(argv or sys.argv[1:])]), name)
    bad = [r for r in results if not r.passed]
    print(f"exactness: {len(results) - len(bad)} of {len(results)} cells pass", flush=True)
    return 1 if bad else 0


def _backend_module(name: str) -> ModuleType:
    if name == "triton":
        from specserve.kernels import triton_sampling

        return triton_sampling
    from specserve.kernels import ref_sampling

    return ref_sampling


if __name__ == "__main__":
    sys.exit(main())
