"""Programmatic dependent launch (PDL): a kernel is launched and its programs start while the kernel
before it in the stream still runs; they wait for that kernel before touching memory.

At decode batch sizes a small model's forward is a chain of short kernels (for the 0.6B-like
draft, five or six a layer), and every boundary costs the next kernel's launch and its programs'
start while the previous kernel's last programs drain. On Hopper and later a kernel launched with
the PDL attribute may begin as soon as every program of the kernel before it has executed
``griddepcontrol.launch_dependents``; it must then execute ``griddepcontrol.wait`` (which returns
once that kernel has completed and its writes are visible) before it reads anything that kernel,
or any kernel before it, wrote, and before it writes anything at all.

Every kernel here with a ``PDL`` constexpr calls :func:`after_producer` before its first load or
store (index arithmetic may come before): the wait, then the release of the next kernel.
Released after the wait, at most one kernel waits ahead of the one running.

Measured on an H100 (2026-11-27, docs/bench-h100/pdl; a model's forward of 1-4 tokens in a CUDA
graph, ``scripts/fused_layer_ab.py --switch pdl``): the 0.6B-like draft (hidden 1024) 1.05x /
1.07x / 1.14x at 1 / 2 / 4 rows; the 1.7B-like (hidden 2048) 0.98x at one row and 1.05x at four;
the 8B-like (4096) 0.97x and 1.03x. So a model's kernels use PDL inside :func:`model_scope` of
a model of hidden size up to :data:`MAX_HIDDEN` (the one that gained at every row count). A
larger model uses it for a forward of :data:`LARGE_MODEL_ROWS` token rows: the 8B-like on an
H100 (2026-12-07, docs/bench-h100/pdl-rows-2026-12-07), like the Llama-3-8B-like, read 0.97x
at 1 row, 1.02-1.03x at 2, 4 and 8, and 1.01x at 16, so a target's verification of k + 1
tokens at batch 1 (k up to 7) gains (the 8B + 0.6B step 1.02-1.03x in the engine) and its
batch-1 decode keeps the launches it had. Models of other sizes above 1,024 (a 1.7B-like read
1.05x at four rows on 2026-11-27; 32B and up were never measured) follow the same rule
unmeasured; a tensor-parallel shard (all-reduces between the layers' kernels) names no rows
(``LlamaFamilyModel.pdl_by_rows``) and keeps the launches it had. No one kernel family gains
alone at either row count (``--pdl-families``), so the decision is the forward's, not each kernel's:
attention and the prologue have the same shapes in the 0.6B and the 1.7B.
The only other user is the rejection sampler's wide tuning (kernels/triton_sampling.py
``Tuning.pdl``; it asks :func:`usable`). Three variants lost and were dropped: each program
prefetching its first weight lines to L2 before the wait (0.6B: 1.00-1.01x at one row, 0.94x
at two, with 16 or 48 MB of prefetch); the release before the wait, which lets every waiting
kernel release the next one too (0.75-0.78x at one row); and, on an H200 (2026-11-28,
docs/bench-h200/l2-ahead), each GEMV asking with ``cp.async.bulk.prefetch.L2`` for the weight
one, two or four projections later before its wait (0.90-0.93x the speed at one row,
0.83-0.96x at four): the draft's layers do not seem to wait on cold weight bytes.

Every kernel that reads or writes memory after a PDL kernel's release must be launched after
the wait of that kernel returns: a kernel launched without the attribute waits for the whole of
the one before (CUDA's stream order), a kernel launched with it waits first. So the chain
is safe link by link; correctness never depends on which kernels opted in.

PDL changes no result: the same loads, sums and stores run in the same order. CUDA graphs keep
it (stream capture records the programmatic edge). Off on the CPU interpreter (no GPU
instructions), on GPUs before compute capability 9.0, and when :func:`set_enabled` turned it
off (an A/B switch; set before graphs are captured: a captured graph keeps its launches).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from specserve.kernels.interpreter import interpreting
from specserve.kernels.jit_keys import settle_cache_keys

_enabled = True

# The largest hidden size of a model whose kernels launch with PDL (the 0.6B-like draft's).
MAX_HIDDEN = 1024
# The kernel families that name themselves to :func:`active`; in a model above MAX_HIDDEN the
# families in LARGE_MODEL_FAMILIES still launch with PDL (none by default: an A/B knob,
# ``scripts/fused_layer_ab.py --pdl-families``, to find which kernels of a large model gain).
FAMILIES = ("gemv", "attention", "norm", "prologue")
LARGE_MODEL_FAMILIES: frozenset[str] = frozenset()
# The token rows of a forward at which a model above MAX_HIDDEN launches every kernel with PDL.
LARGE_MODEL_ROWS = range(2, 9)
_model_hidden: Optional[int] = None      # the hidden size of the model in scope, if any
_model_rows: Optional[int] = None        # the token rows of its forward, where the model said


def set_enabled(flag: bool) -> None:
    """Whether kernels may launch with PDL (default on where the GPU supports it)."""
    global _enabled
    _enabled = bool(flag)


@functools.lru_cache(maxsize=None)
def _supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@contextlib.contextmanager
def model_scope(hidden_size: int, rows: Optional[int] = None) -> Iterator[None]:
    """Launches inside run a model of this hidden size over ``rows`` token rows (the model's
    forward wraps its layers and head in it); PDL is used only inside a scope: for hidden sizes
    up to MAX_HIDDEN, and above it for a forward of LARGE_MODEL_ROWS rows."""
    global _model_hidden, _model_rows
    saved = _model_hidden, _model_rows
    _model_hidden, _model_rows = hidden_size, rows
    try:
        yield
    finally:
        _model_hidden, _model_rows = saved


def usable(x: torch.Tensor) -> bool:
    """Whether a launch on ``x``'s device may use PDL at all: switched on, a GPU that has it,
    not the interpreter. A kernel family outside a model (the sampler) decides for itself."""
    return _enabled and not interpreting() and x.is_cuda and _supported(x.device)


def active(x: torch.Tensor, family: str = "") -> bool:
    """Whether a model's launch on ``x``'s device uses PDL now: inside a small model's scope;
    inside a large model's scope over LARGE_MODEL_ROWS rows; or, for a kernel of ``family``
    (one of FAMILIES), inside any model's scope while LARGE_MODEL_FAMILIES holds it."""
    hidden = _model_hidden
    return (hidden is not None
            and (hidden <= MAX_HIDDEN or _model_rows in LARGE_MODEL_ROWS
                 or family in LARGE_MODEL_FAMILIES)
            and usable(x))


def launch_options(pdl: bool) -> dict:
    """The launch keyword that asks the driver for PDL (empty when off, so the interpreter and
    older GPUs see the launch they always had)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def after_producer(PDL: tl.constexpr):
    """Block until the kernel before has completed and its writes are visible
    (at once for a launch without PDL), then let the next kernel launch once every program of
    this one has been here."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
