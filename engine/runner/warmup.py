"""Compiling the eager forward's kernel variants at start-up, before traffic meets them.

Decode steps replay CUDA graphs captured at start-up. Everything else runs the models eagerly:
prefill chunks, steps that mix prefill chunks with decodes, the draft's catch-up after steps at
k = 0. Triton compiles a kernel variant the first time a launch meets a new specialisation (a
token or request count of 1, a multiple of 16, or neither; the attention tile set by the longest
query), and a compile takes 0.2-0.9 s on an H100. Left to traffic, those compiles land in the
first requests' latency: on a fresh H100 machine (empty Triton cache) the bench's first
serve-load run served concurrency 16 at 699 tok/s with a TTFT p50 of 765 ms and concurrency 64
with an ITL p99 of 822 ms, where the next two runs, on the cache the first one filled, served
3,190 tok/s at 63 ms and an ITL p99 of 45-50 ms.

``warm_up_eager`` runs each model's eager forward once at the shapes a server meets first, on the
empty KV cache (every item writes blocks no request owns yet). With a warm Triton cache it
takes about a second; on a cold one it moves the compiles from the first requests to start-up.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from specserve.engine.runner.inputs import ForwardItem

log = logging.getLogger("specserve.runner")

_LONG = 600   # the longest single prompt chunk warmed (bounded by the cache and the context)


def eager_shapes(rows: int) -> list[tuple[int, int]]:
    """(requests, tokens each) of the eager forwards to warm: one request at every length up to
    64 tokens, several requests (1-8 rows of logits take the GEMV path) at a few lengths, the
    batch's row count, and long chunks."""
    shapes = [(1, n) for n in range(1, 65)]
    shapes += [(b, n) for b in (2, 3, 4, 5, 6, 7, 8, rows) for n in (2, 31, 40)]
    shapes += [(1, 128), (1, _LONG), (rows, 128)]
    return shapes


@torch.inference_mode()
def warm_up_eager(runner, rows: int, cuda_only: bool = True,
                  max_tokens: Optional[int] = None) -> int:
    """Run the target's and the draft's eager forwards at ``eager_shapes(rows)`` (CUDA only;
    the target is skipped when tensor-parallel, whose ranks are not serving yet). The target's
    items want the last token's logits, as a prompt's final chunk does; a mixed step (decoding
    rows beside one prompt chunk) is warmed at each size too. ``max_tokens`` (the scheduler's
    --max-num-batched-tokens): the target runs no forward larger than a step can be (a small
    token budget gets no oversized activations at start-up) and warms a prompt chunk of
    exactly that size instead; the draft, whose catch-up is not cut to the budget, runs every
    shape. Returns the forwards run."""
    if cuda_only and runner.device.type != "cuda":   # nothing compiles on the CPU path
        return 0
    t0 = time.monotonic()
    bs = runner.block_size
    kv = runner.target_kv[0][0]
    room = min(_LONG, kv.shape[0] * bs - 1, runner.max_model_len - 1)   # a decode row sits past it
    budget = max_tokens if max_tokens is not None else float("inf")
    models = [] if runner.tp is not None else ["target"]
    if runner.draft is not None:
        models.append("draft")
    shapes = eager_shapes(rows)
    if budget < room:
        shapes.append((1, int(budget)))               # a long prompt's chunk at the budget
    # the ragged CUDA graphs (captured before this) would replay most of these shapes: set
    # them aside so the eager path's own variants compile (forwards beyond the graphs' size)
    graphs = getattr(runner, "ragged", None)
    if graphs:
        runner.ragged = {}
    try:
        count = _run_shapes(runner, shapes, models, bs, room, budget)
    finally:
        if graphs:
            runner.ragged = graphs
    log.info("warmed up the eager forward at %d shapes (%s) in %.1fs", len(shapes),
             " + ".join(models) or "none", time.monotonic() - t0)
    return count


def _run_shapes(runner, shapes: list[tuple[int, int]], models: list[str], bs: int, room: int,
                budget: float) -> int:
    count = 0
    for n_reqs, length in shapes:
        length = min(length, room)
        blocks = list(range(-(-(length + 1) // bs)))
        for which in models:
            if which == "target" and n_reqs * length > budget:
                continue
            logits = 1 if which == "target" else 0
            items = [ForwardItem([5 + (i + j) % 97 for j in range(length)], 0, blocks, logits)
                     for i in range(n_reqs)]
            batches = [items]
            if which == "target" and n_reqs > 1:   # and decodes beside one prompt chunk
                batches.append(items[:1] + [ForwardItem([7 + i], length, blocks, 1)
                                            for i in range(n_reqs - 1)])
            for batch in batches:
                runner._forward(which, batch)
                count += 1
    return count
