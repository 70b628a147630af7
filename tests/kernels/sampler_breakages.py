"""Deliberately broken copies of the rejection sampler, to show the exactness checks catch bugs.

Each breakage is a set of source edits applied to a copy of the real module (the torch twin
``kernels/ref_sampling.py``, or the Triton kernels ``kernels/sampling_triton_kernels.py`` and
their launcher ``kernels/triton_sampling.py``). The copy is written to a temporary folder and
imported from there (Triton needs a real source file), so the product code carries no switches.
Every edit must match exactly once: a refactor of the sampler that moves the edited line makes
these fail loudly instead of silently testing nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import specserve.kernels as kernels_pkg

KERNELS = Path(kernels_pkg.__file__).parent


@dataclass(frozen=True)
class Breakage:
    """What a bug does, and the source edits that make it, per twin."""

    name: str
    what: str
    ref: tuple[tuple[str, str], ...]              # edits of ref_sampling.py
    triton_kernels: tuple[tuple[str, str], ...]   # edits of sampling_triton_kernels.py
    triton_launcher: tuple[tuple[str, str], ...] = ()  # edits of triton_sampling.py


BREAKAGES = {b.name: b for b in [
    Breakage(
        "wrong_row_q", "the accept test reads the draft probability of the next draft row",
        ref=(("else q[lay.draft_idx],",
              "else q[torch.where(lay.j < lay.k[lay.req], lay.draft_idx - lay.j + (lay.j + 1) "
              "% lay.k[lay.req].clamp(min=1), lay.draft_idx)],"),),
        triton_kernels=(("qx = tl.load(q_ptr + (c0 + n).to(tl.int64) * V + xj)",
                         "qx = tl.load(q_ptr + (c0 + (n + 1) % k_b).to(tl.int64) * V + xj)"),
                        ("qx = tl.load(q_ptr + (c0 + j).to(tl.int64) * V + xj, mask=live",
                         "qx = tl.load(q_ptr + (c0 + (j + 1) % tl.maximum(k_b, 1)).to(tl.int64)"
                         " * V + xj, mask=live"))),
    Breakage(
        "skipped_chunk", "the recovery leaves part of the vocabulary out of the residual",
        ref=(("    return torch.clamp(weights - mass * q, min=0.0)\n",
              "    r = torch.clamp(weights - mass * q, min=0.0)\n"
              "    r[:, r.shape[1] // 3: 2 * r.shape[1] // 3] = 0.0\n    return r\n"),),
        triton_kernels=(("tl.store(sums_r + start // BLOCK + tiles, rs, mask=live)",
                         "tl.store(sums_r + start // BLOCK + tiles, tl.where((start // BLOCK + tiles)"
                         " % 3 == 1, 0.0, rs), mask=live)"),)),
    Breakage(
        "bf16_q", "the draft probabilities are read in bf16",
        ref=(("torch.cat([draft_probs.to(torch.float32),",
              "torch.cat([draft_probs.to(torch.bfloat16).to(torch.float32),"),),
        triton_kernels=(),
        triton_launcher=(("q = draft_probs.to(torch.float32).contiguous()",
                          "q = draft_probs.to(torch.bfloat16).to(torch.float32).contiguous()"),)),
    Breakage(
        "bonus_from_residual", "after k acceptances the bonus is drawn from max(p - q_k, 0), not p",
        ref=(("else q[lay.draft_idx[sel]]",
              "else q[lay.draft_idx[sel] - (lay.j[sel] == lay.k[lay.req[sel]]).to(torch.int64)]"),
             ("        rejected = n_acc < lay.k\n", "        rejected = lay.k > 0\n")),
        triton_kernels=(("            xj = tl.load(drafts_ptr + c0 + n, mask=n < k_b, other=-1).to(tl.int32)\n"
                         "            q_row = q_ptr + (c0 + n).to(tl.int64) * V\n",
                         "            xj = tl.load(drafts_ptr + c0 + tl.minimum(n, k_b - 1)).to(tl.int32)\n"
                         "            q_row = q_ptr + (c0 + tl.minimum(n, k_b - 1)).to(tl.int64) * V\n"),
                        ("    xj = tl.load(drafts_ptr + c0 + n, mask=n < k_b, other=-1).to(tl.int32)\n"
                         "    w, r = _residual_tile(logits_ptr + row.to(tl.int64) * stride,\n"
                         "                          q_ptr + (c0 + n).to(tl.int64) * V,",
                         "    xj = tl.load(drafts_ptr + c0 + tl.minimum(n, k_b - 1)).to(tl.int32)\n"
                         "    w, r = _residual_tile(logits_ptr + row.to(tl.int64) * stride,\n"
                         "                          q_ptr + (c0 + tl.minimum(n, k_b - 1)).to(tl.int64) * V,"))),
    Breakage(
        "bonus_reuses_accept_draw", "the bonus token is drawn with the last draft's accept "
        "number, which its acceptance conditions (the bonus must take a number of its own)",
        ref=(("    return inverse_cdf(d.weights[sel], uniform52(seeds, pos, RECOVER))",
              "    return inverse_cdf(d.weights[sel], uniform(seeds, pos - 1, ACCEPT, torch.zeros("
              "1, dtype=torch.int64, device=seeds.device)).squeeze(1).double())"),),
        triton_kernels=(("    target = _uniform52(seed, pos, 3) * tl.sum(sums, 0)",
                         "    target = tl.where(n < k_b, _uniform52(seed, pos, 3), _uniform(seed, pos - 1, 2, "
                         "tl.full([], 0, tl.int32)).to(tl.float64)) * tl.sum(sums, 0)"),)),
]}


def _edit(text: str, edits: tuple[tuple[str, str], ...], where: str) -> str:
    for old, new in edits:
        count = text.count(old)
        if count != 1:
            raise AssertionError(f"{where}: the breakage's edit matches {count} times, expected once: {old!r}")
        text = text.replace(old, new)
    return text


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def broken_module(breakage: str, backend: str, folder: Path) -> ModuleType:
    """A copy of the ``backend`` twin (``torch`` or ``triton``) with ``breakage`` applied; it has
    the twin's ``sample_draft`` and ``rejection_sample``."""
    b = BREAKAGES[breakage]
    folder.mkdir(parents=True, exist_ok=True)
    if backend == "torch":
        path = folder / f"ref_sampling_{b.name}.py"
        path.write_text(_edit((KERNELS / "ref_sampling.py").read_text(), b.ref, "ref_sampling.py"))
        return _load(path, f"broken_ref_sampling_{b.name}")
    kname = f"broken_triton_kernels_{b.name}"
    kpath = folder / f"{kname}.py"
    kpath.write_text(_edit((KERNELS / "sampling_triton_kernels.py").read_text(), b.triton_kernels,
                           "sampling_triton_kernels.py"))
    _load(kpath, kname)
    launcher = _edit((KERNELS / "triton_sampling.py").read_text(),
                     (("from specserve.kernels import sampling_triton_kernels as K", f"import {kname} as K"),
                      *b.triton_launcher), "triton_sampling.py")
    lpath = folder / f"triton_sampling_{b.name}.py"
    lpath.write_text(launcher)
    return _load(lpath, f"broken_triton_sampling_{b.name}")


def detection_cell(breakage: str, on_gpu: bool, rows: int):
    """A cell in which ``breakage`` must show. On the GPU at production shape (V = 151,936,
    bf16); on the CPU at V = 512, fp32. The bf16-q breakage needs a draft that nearly equals the
    target (the few rejections are decided by differences below bf16's resolution), the bonus
    breakage a k whose bonus is frequent."""
    from specserve.bench.exactness import Cell

    base = Cell(vocab=151_936 if on_gpu else 512, dtype="bfloat16" if on_gpu else "float32",
                batch=64, k=3, rows=rows, seed=7000)
    if breakage == "bf16_q":
        return Cell(vocab=base.vocab, dtype="float32", batch=256 if on_gpu else 64, k=8,
                    draft_noise=0.001 if on_gpu else 0.0005, rows=rows, seed=7001)
    if breakage in ("bonus_from_residual", "bonus_reuses_accept_draw"):
        return Cell(vocab=base.vocab, dtype=base.dtype, batch=64, k=1, rows=rows, seed=7002)
    return base
