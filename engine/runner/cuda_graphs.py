"""CUDA graphs of a model's forward + LM head for uniform batches.

A batch fits a graph of query length ``q`` when every request feeds at most ``q`` tokens and
wants logits: plain decode and draft steps (q = 1), the draft's catch-up (q = 2), verification
of up to k drafts (q = k + 1; a request with fewer drafts near its max_tokens is padded).
Graphs are captured once per (q, batch bucket) with static input buffers; a smaller batch is
padded to its bucket with rows that write no KV (slot -1) and attend only to block 0. The
attention kernel's launch grid is sized from ``max_model_len`` at capture, so one graph serves
every context length. Anything else (prefill chunks, mixed q) runs eagerly.

Each forward is captured as two graphs: the first few layers, then the rest. Launching a graph
costs the host about half a microsecond per kernel, and the GPU starts only when the launch
returns; with a short first piece the GPU is already working while the host launches the long
second one, instead of idling for the whole launch.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from typing import Any, Callable, Optional

import torch

from specserve.engine.models.llama import AttentionMetadata, KVCache, LlamaFamilyModel
from specserve.engine.runner.inputs import ForwardItem
from specserve.engine.runner.transfer import fill_rows, host_buffer, host_tensor, to_device

log = logging.getLogger("specserve.runner")

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def first_piece_layers(num_layers: int) -> int:
    """Layers in the first graph of a forward: about a twelfth of them (3 of 36, 3 of 28)."""
    return max(1, -(-num_layers // 12))


def buckets_up_to(max_batch: int) -> list[int]:
    """The batch buckets graphs are captured at for batches of at most ``max_batch`` rows."""
    return [b for b in BUCKETS if b <= max_batch] or [1]


def verify_widths(k_max: int) -> list[int]:
    """Query lengths the verification graphs are captured at for drafts up to ``k_max``: every
    width 2..9 (k = 1..8), then 17 and k_max + 1. A step verifying k drafts replays the next
    width up, so a k that changes every step never captures anything. Up to k = 8 each k has
    its own width: padded to the next of 2/3/5/9, adaptive k paid up to a width-9 verification
    for k = 5 and lost 10-15% to a fixed k = 5 engine on an H100 at batch 64 (the cost model
    knows any padding left, engine/spec_control.py)."""
    widths = {q for q in (*range(2, 10), 17) if q <= k_max + 1}
    return sorted(widths | {k_max + 1})


def forward_graph_plan(k_max: int) -> list[tuple[str, int]]:
    """(model, query length) of every forward the runner captures: the target's decode, its
    verification widths and, with a draft, the draft's one-token pass."""
    plan = [("target", 1)]
    if k_max:
        plan += [("target", q) for q in verify_widths(k_max)] + [("draft", 1)]
    return plan


def graph_logits_bytes(k_max: int, max_batch: int, vocab: int, elem: int) -> int:
    """Device memory the captured graphs' logits keep for the engine's life: each (forward,
    batch bucket b) holds its [b * q, V] output, which the shared pool cannot reuse (3-4 GB for
    a 152k vocabulary in bf16 at k_max 8 and 256 sequences). The KV cache is sized after it."""
    rows = sum(b * q for _, q in forward_graph_plan(k_max) for b in buckets_up_to(max_batch))
    return rows * vocab * elem


# pieces() -> (callables, state): fresh closures each call; the state is what they hand on
PieceFactory = Callable[[], tuple[list[Callable[[], None]], list]]


def capture_pieces(pieces: PieceFactory, pool) -> tuple[list[torch.cuda.CUDAGraph], list, Any]:
    """Run one set of pieces eagerly (Triton compiles, libraries pick their kernels), then
    capture a fresh set, each piece a graph of its own, in the memory pool ``pool`` (the first
    graph's when None). Returns the graphs, the captured pieces' state (keep it: one piece's
    outputs are the next one's inputs, and the last one's are the graph's results) and the pool."""
    warm_up, _ = pieces()
    for piece in warm_up:
        piece()
    torch.cuda.synchronize()
    captured, state = pieces()
    graphs = []
    with collector_paused():
        for piece in captured:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                piece()
            if pool is None:
                pool = graph.pool()
            graphs.append(graph)
    return graphs, state, pool


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the captures. A collection that starts inside
    a capture may free unreachable CUDA graphs (another engine's, or anything in a reference
    cycle that holds them), and a graph's destructor is a CUDA call a capture forbids: the
    capture fails with "operation failed due to a previous error during capture" at some later
    launch. torch.cuda.graph no longer collects before a capture (torch.compiler.config.
    force_cudagraph_gc), so when this happened depended on allocation counts: the GPU engine
    tests hit it in one order of one build (H100, 2026-11-27)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class PiecewiseGraphs:
    """A model's forward captured in pieces (``first_piece_layers``), one set of graphs per key
    (a batch or token bucket), over static ``input_ids`` / ``positions`` buffers a subclass
    owns with the attention metadata (``_tokens``, ``_meta``) and the last piece's result
    (``_finish``)."""

    input_ids: torch.Tensor
    positions: torch.Tensor

    def __init__(self, model: LlamaFamilyModel, kv: list[KVCache]):
        self.model, self.kv = model, kv
        layers = model.spec.num_layers
        head = min(first_piece_layers(layers), layers)
        self.pieces = [(0, head), (head, layers)] if head < layers else [(0, layers)]
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.carried: dict[int, list] = {}   # each piece's outputs: the next one's inputs
        self.pool = None

    def _tokens(self, key: int) -> int:
        raise NotImplementedError

    def _meta(self, key: int) -> AttentionMetadata:
        raise NotImplementedError

    def _finish(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last piece's result from the final-normed hidden states."""
        raise NotImplementedError

    def _run_piece(self, key: int, lo: int, hi: int, carried: Optional[tuple]):
        """Layers lo..hi-1 on the static inputs: (hidden, residual) to carry on, or ``_finish``
        after the last layer."""
        n, model = self._tokens(key), self.model
        x, residual = carried if lo > 0 else (model.embed_tokens(self.input_ids[:n]), None)
        x, residual = model.run_layers(x, residual, self.positions[:n], self._meta(key), self.kv, lo, hi)
        if hi < model.spec.num_layers:
            return x, residual
        return self._finish(model.final_norm(x, residual))

    def _pieces(self, key: int) -> tuple[list, list]:
        """The forward for ``key`` as one callable per piece, and the list of their outputs."""
        outs: list = []

        def piece(lo: int, hi: int) -> None:
            outs.append(self._run_piece(key, lo, hi, outs[-1] if lo > 0 else None))

        return [lambda lo=lo, hi=hi: piece(lo, hi) for lo, hi in self.pieces], outs

    def _capture_all(self, keys: list[int]) -> None:
        """Capture each key in turn (pass the largest first: the pool's peak is set by it)."""
        for key in keys:
            graphs, outs, self.pool = capture_pieces(lambda: self._pieces(key), self.pool)
            self.graphs[key], self.outputs[key], self.carried[key] = graphs, outs[-1], outs
        torch.cuda.synchronize()


class GraphedForward(PiecewiseGraphs):
    """Graphs for one model and one query length ``q``, over batch buckets up to ``max_batch``."""

    def __init__(self, model: LlamaFamilyModel, kv: list[KVCache], q: int, max_batch: int,
                 max_blocks: int, max_model_len: int, block_size: int, device: torch.device):
        super().__init__(model, kv)
        self.q = q
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.buckets = buckets_up_to(max_batch)
        bmax = self.buckets[-1]
        n = bmax * q
        i64, i32 = torch.int64, torch.int32
        self.input_ids = torch.zeros(n, dtype=i64, device=device)
        self.positions = torch.zeros(n, dtype=i64, device=device)
        self.slots = torch.full((n,), -1, dtype=i64, device=device)
        self.block_tables = torch.zeros((bmax, max_blocks), dtype=i32, device=device)
        self.qsl = torch.arange(0, (bmax + 1) * q, q, dtype=i32, device=device)
        self.seq_lens = torch.full((bmax,), q, dtype=i32, device=device)

    def _tokens(self, b: int) -> int:
        return b * self.q

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(self.slots[:b * self.q], self.block_tables[:b], self.qsl[:b + 1],
                                 self.seq_lens[:b], self.q, self.max_model_len)

    def _finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.monotonic()
        self._capture_all(list(reversed(self.buckets)))
        log.info("captured %d CUDA graphs (q=%d, batch <= %d, %d pieces each) for %s in %.1fs",
                 len(self.graphs), self.q, self.buckets[-1], len(self.pieces),
                 self.model.spec.architecture, time.monotonic() - t0)

    def fits(self, items: list[ForwardItem]) -> bool:
        """Every item feeds at most q tokens (shorter runs are padded) and wants logits."""
        return (0 < len(items) <= self.buckets[-1]
                and all(0 < it.num_logits <= len(it.token_ids) <= self.q for it in items))

    @torch.inference_mode()
    def run(self, items: list[ForwardItem], input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [sum(num_logits), V]; when every item wants all q rows this is a view into the
        graph's output, to be consumed before the next run. ``input_ids`` (one-token items only,
        a device tensor [len(items)]) replaces the items' own token ids."""
        nreq = len(items)
        b = next(x for x in self.buckets if x >= nreq)
        q, bs = self.q, self.block_size
        width = self.block_tables.shape[1]
        tables = host_buffer((b, width), torch.int32, self.input_ids.device)
        if q == 1:   # decode and draft steps: one token a row (``fits``: 1 <= tokens <= q)
            pos = [it.start for it in items]
            slots = [it.block_ids[x // bs] * bs + x % bs for it, x in zip(items, pos)]
            seq_lens = [x + 1 for x in pos]
        else:
            pos, slots, seq_lens = [], [], []
            for it in items:
                # a run shorter than q (a verification with fewer drafts) is padded at its end:
                # the pad positions write no KV (slot -1) and, being later, are never attended to
                n_real = len(it.token_ids)
                pos.extend(range(it.start, it.start + q))
                slots.extend(it.block_ids[x // bs] * bs + x % bs for x in range(it.start, it.start + n_real))
                slots.extend([-1] * (q - n_real))
                seq_lens.append(it.start + q)
        fill_rows(tables, [it.block_ids for it in items])
        pad = b - nreq
        pos += [0] * (pad * q)
        slots += [-1] * (pad * q)
        seq_lens += [q] * pad
        n = b * q
        dev = self.input_ids.device
        self.positions[:n].copy_(host_tensor(pos, torch.int64, dev), non_blocking=True)
        self.slots[:n].copy_(host_tensor(slots, torch.int64, dev), non_blocking=True)
        self.seq_lens[:b].copy_(host_tensor(seq_lens, torch.int32, dev), non_blocking=True)
        self.block_tables[:b].copy_(tables, non_blocking=True)
        if input_ids is not None:
            if q != 1:
                raise ValueError("device input ids are for the one-token decode graph")
            self.input_ids[:nreq].copy_(input_ids)
        else:
            ids = [t for it in items for t in it.token_ids + [0] * (q - len(it.token_ids))]
            self.input_ids[:nreq * q].copy_(host_tensor(ids, torch.int64, dev), non_blocking=True)
        for graph in self.graphs[b]:
            graph.replay()
        out = self.outputs[b]
        if all(it.num_logits == q for it in items):
            return out[:nreq * q]
        rows = [r * q + len(it.token_ids) - it.num_logits + j
                for r, it in enumerate(items) for j in range(it.num_logits)]
        return out.index_select(0, to_device(rows, torch.int64, out.device))
