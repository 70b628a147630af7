"""Start-up calibration of the adaptive-k cost model: what the device takes for a step's parts.

Measured on the runner's own paths (CUDA graphs where the runner replays them, eager otherwise):

* target: one forward of B requests x w tokens each, plus the rejection sampler over it with
  w - 1 drafts per request, for every verification width the runner has a graph for (or
  1 and k_max + 1 when eager, interpolated between) and every batch bucket (or a few sizes);
* draft: the proposal program (draft_loop.py) with k_max drafts per request, per pass.

It runs before any request, on the empty KV cache (every row writes the same few blocks, which
no request owns yet). A few hundred milliseconds on an H100, about a second on CPU with the
demo pair; the table is logged and shown in /debug/state.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from specserve.engine.request import Request
from specserve.engine.runner.cuda_graphs import buckets_up_to
from specserve.engine.runner.draft_loop import LoopRow
from specserve.engine.runner.inputs import ForwardItem
from specserve.engine.runner.sampling_inputs import SamplingTensors
from specserve.engine.spec_control import Calibration
from specserve.engine.types import SamplingParams
from specserve.kernels import ops

log = logging.getLogger("specserve.runner")

_CONTEXT = 32     # tokens before the measured positions (short: the cost model is per step)


def _timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn``."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _requests(n: int, blocks: list[int], k: int) -> list[Request]:
    reqs = []
    for i in range(n):
        req = Request(f"calibration-{i}", [5 + i % 7] * (_CONTEXT + 2), SamplingParams(temperature=1.0),
                      seed=i, eos_token_ids=(), max_tokens=k + 2, arrival=0.0)
        req.block_ids = blocks
        reqs.append(req)
    return reqs


def _target_step(runner, reqs: list[Request], width: int) -> Callable[[], object]:
    """One target forward of ``width`` tokens per request and the rejection sampler over it."""
    dev, vocab = runner.device, runner.vocab_size
    items = [ForwardItem([(7 + 13 * i + j) % vocab for j in range(width)], _CONTEXT, r.block_ids, width)
             for i, r in enumerate(reqs)]
    k = width - 1
    n = len(reqs)
    cu = torch.arange(0, (n + 1) * k, max(k, 1), dtype=torch.int32, device=dev)[:n + 1] if k else \
        torch.zeros(n + 1, dtype=torch.int32, device=dev)
    draft_ids = torch.full((n * k,), 3, dtype=torch.int64, device=dev)
    probs = (torch.full((n * k, vocab), 1.0 / vocab, dtype=torch.float32, device=dev)
             if k and runner.spec.store_probs else None)
    st = SamplingTensors.build(reqs, [1] * n, dev)

    def run():
        logits = runner._forward("target", items)
        return ops.rejection_sample(logits, cu, draft_ids, probs, st.temperature, st.top_k, st.top_p,
                                    st.min_p, st.seeds, st.positions, runner.spec.rejection_method, k)

    return run


@torch.inference_mode()
def calibrate(runner, max_num_seqs: int) -> Calibration:
    """The cost table of ``runner`` (which must have a draft model)."""
    t0 = time.monotonic()
    k_max, dev = runner.num_speculative_tokens, runner.device
    graphed = bool(runner.graphs)
    if graphed:
        batches = buckets_up_to(min(max_num_seqs, runner.draft_loop.buckets[-1]))
        widths = sorted(q for (w, q) in runner.graphs if w == "target")
        warmup, repeats = 2, 5
    else:
        batches = sorted({1, min(16, max_num_seqs, runner.draft_loop.buckets[-1])})
        widths = sorted({1, k_max + 1})
        warmup, repeats = 1, 3    # rough: real steps refine it (spec_control.CostModel)
    per = -(-(_CONTEXT + k_max + 2) // runner.block_size)
    blocks = list(range(per))
    target, draft = [], []
    for b in batches:
        reqs = _requests(b, blocks, k_max)
        target.append([_timed(_target_step(runner, reqs, w), dev, warmup, repeats) for w in widths])
        rows = [LoopRow(r, [11, 12], _CONTEXT, k_max, 1) for r in reqs]
        draft.append(_timed(lambda: runner.draft_loop.run(rows), dev, warmup, repeats) / k_max)
    price = _catchup_cost(runner, k_max, min(16, batches[-1]), warmup, repeats)
    cal = Calibration(batches, widths, target, draft, padded=graphed, seconds=time.monotonic() - t0,
                      **price)
    graph = (f"; up to {cal.catchup_graph_tokens} tokens (ragged graph): "
             f"{cal.catchup_graph_fixed * 1e3:.2f} ms + {cal.catchup_graph_token * 1e6:.2f} us/token"
             if cal.catchup_graph_tokens else "")
    log.info("adaptive k: calibrated in %.2fs; target step (ms) by batch %s x width %s: %s; "
             "draft pass (ms): %s; draft catch-up: eager %.2f ms + %.2f us/token%s", cal.seconds,
             batches, widths, [[round(t * 1e3, 3) for t in row] for row in target],
             [round(t * 1e3, 3) for t in draft], cal.catchup_fixed * 1e3, cal.catchup_token * 1e6,
             graph)
    return cal


_CATCHUP_LONG = 128   # tokens a row in the large catch-up measured (16 rows: 2,048 tokens)


def _catchup_cost(runner, k_max: int, rows: int, warmup: int, repeats: int) -> dict:
    """The Calibration fields pricing the draft's catch-up (``catchup_*``). Eager: seconds of a
    small catch-up forward, seconds per token of a large one, of the draft's KV-only forward over
    committed tokens (what a request pays to draft again after steps at k = 0), from one row of
    _CONTEXT tokens and ``rows`` rows of _CATCHUP_LONG tokens each.

    It runs eager, so a small one is launch-bound: on an H100 the 0.6B-like draft took ~10 ms
    for 1 x 37 tokens and 16 x 32 alike. Priced per token from the 16 x 32 forward alone (20 us),
    a probe's catch-up at batch 1 cost 14x its price. A large one is compute-bound: after 256
    rows at k = 0 the self-draft's catch-up covered ~40k tokens of a 1.7B-like model, priced at
    12 ms from two launch-bound points (1 x 32, 16 x 32) while it took a large share of a
    second, and a probe it paid for held its batch-256 cell at 0.67x plain. So the price of a
    catch-up is the larger of the small forward's time and its tokens at the large forward's
    rate (``CostModel.catchup_seconds``): launch-bound below, compute-bound above.

    With the draft's ragged CUDA graphs (ragged_graphs.py) a catch-up of up to their size
    replays one instead: the same two points are measured through the graphs (the large one
    at their size), and the eager ones with the graphs set aside."""
    vocab = runner.vocab_size
    num_blocks = runner.draft_kv[0][0].shape[0]
    long = max(_CONTEXT, min(_CATCHUP_LONG, (num_blocks - 1) * runner.block_size))
    blocks = list(range(-(-long // runner.block_size)))
    reqs = _requests(rows, blocks, k_max)

    def forward(n: int, tokens: int) -> Callable[[], object]:
        items = [ForwardItem([(5 + 3 * i + j) % vocab for j in range(tokens)], 0, r.block_ids, 0)
                 for i, r in enumerate(reqs[:n])]
        return lambda: runner._draft_forward(items)

    def price(rows: int) -> tuple[float, float]:
        one = _timed(forward(1, _CONTEXT), runner.device, warmup, repeats)
        if rows * long <= _CONTEXT:
            return one, one / _CONTEXT
        return one, _timed(forward(rows, long), runner.device, warmup, repeats) / (rows * long)

    graphs = getattr(runner, "ragged", None) or {}
    runner.ragged = {w: g for w, g in graphs.items() if w != "draft"}
    try:
        fixed, per_token = price(rows)
    finally:
        runner.ragged = graphs
    out = dict(catchup_fixed=fixed, catchup_token=per_token)
    ragged = graphs.get("draft")
    if ragged is not None and ragged.max_tokens >= _CONTEXT:
        fixed, per_token = price(max(1, min(rows, ragged.max_tokens // long)))
        out.update(catchup_graph_tokens=ragged.max_tokens, catchup_graph_fixed=fixed,
                   catchup_graph_token=per_token)
    return out
