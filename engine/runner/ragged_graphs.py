"""CUDA graphs of a model's body for ragged batches: prefill chunks, mixed steps, catch-ups.

The graphs of cuda_graphs.py serve uniform batches (every request feeds at most q tokens).
Everything else used to run eagerly: a prompt's chunk, a step that decodes beside a chunk, the
draft's catch-up after steps at k = 0. An eager forward launches every kernel from Python, about
8 per layer, and on an H100 a 28-layer model's eager forward cost ~11 ms whatever its size up to
~2k tokens (the draft catch-up calibration of 2026-11-26): the launches, not the GPU, set its time.

A ``RaggedGraphedForward`` captures the body (embedding, decoder layers, final norm) once per
token bucket T (16, 32, ..., up to --ragged-graph-tokens) for any mix of up to ``max_reqs``
requests of any lengths summing to at most T. What makes one graph serve every mix: the
attention kernel finds each tile's request on the device (a search over query_start_loc) and
sizes its grid from the token and request counts alone, and both are fixed per bucket:
- requests past the batch's own are padded with zero-length runs (query_start_loc stays at the
  last real token, context 0), whose tiles exit at once;
- token rows past the real ones belong to no request: position 0, slot -1 (no KV write), and
  the attention leaves their output zero; every other op works row by row, so they touch no
  real row;
- the attention's tile height is chosen as for a single query of T tokens, and its context
  bound is max_model_len, as in the eager path.

The LM head runs after the replay, on the rows that want logits only. A bucket's result equals
the eager forward up to the rounding of GEMMs run at a padded row count (cuBLAS may pick another
kernel for 512 rows than for 300).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from specserve.engine.models.llama import AttentionMetadata, KVCache, LlamaFamilyModel
from specserve.engine.models.spec import ModelSpec
from specserve.engine.runner.cuda_graphs import PiecewiseGraphs
from specserve.engine.runner.inputs import ForwardItem, flatten
from specserve.engine.runner.transfer import fill_rows, host_buffer, host_tensor, to_device

log = logging.getLogger("specserve.runner")

TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def token_buckets(max_tokens: int) -> list[int]:
    """The token buckets captured for forwards of at most ``max_tokens`` tokens (none for 0):
    the powers of two below it and the limit itself, rounded up to a multiple of 16 (a step
    budget of 1,000 tokens would otherwise run its full chunks eagerly)."""
    if max_tokens <= 0:
        return []
    buckets = [t for t in TOKEN_BUCKETS if t < max_tokens]
    return buckets + [-(-max_tokens // 16) * 16]


def ragged_graph_bytes(spec: ModelSpec, max_tokens: int, elem: int) -> int:
    """Device memory one model's ragged graphs keep: the graph pool's peak (a layer's
    activations at the largest bucket, counted generously) plus every bucket's rows kept
    between pieces and as output (hidden and residual of the first piece, the output)."""
    buckets = token_buckets(max_tokens)
    if not buckets:
        return 0
    hidden = spec.hidden_size
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = 6 * hidden + 3 * spec.intermediate_size + 2 * qkv
    return buckets[-1] * per_token * elem + 3 * sum(buckets) * hidden * elem


class RaggedGraphedForward(PiecewiseGraphs):
    """One model's body as CUDA graphs, one per token bucket, for ragged batches of up to
    ``max_reqs`` requests. ``run`` stages the batch into static buffers, replays the bucket's
    graphs (or, before ``capture`` and on the CPU, runs the same padded forward eagerly: tests
    check the padding that way) and projects the rows that want logits."""

    def __init__(self, model: LlamaFamilyModel, kv: list[KVCache], max_tokens: int, max_reqs: int,
                 max_blocks: int, max_model_len: int, block_size: int, device: torch.device):
        super().__init__(model, kv)
        self.buckets = token_buckets(max_tokens)
        if not self.buckets:
            raise ValueError("ragged graphs need max_tokens >= 1")
        self.max_reqs, self.block_size, self.max_model_len = max_reqs, block_size, max_model_len
        tmax = self.buckets[-1]
        i64, i32 = torch.int64, torch.int32
        self.input_ids = torch.zeros(tmax, dtype=i64, device=device)
        self.positions = torch.zeros(tmax, dtype=i64, device=device)
        self.slots = torch.full((tmax,), -1, dtype=i64, device=device)
        self.block_tables = torch.zeros((max_reqs, max_blocks), dtype=i32, device=device)
        self.qsl = torch.zeros(max_reqs + 1, dtype=i32, device=device)
        self.seq_lens = torch.zeros(max_reqs, dtype=i32, device=device)

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def fits(self, items: list[ForwardItem]) -> bool:
        """At most max_reqs requests, each feeding at least one token, at most T tokens in all."""
        return (0 < len(items) <= self.max_reqs and all(it.token_ids for it in items)
                and sum(len(it.token_ids) for it in items) <= self.max_tokens)

    def _tokens(self, t: int) -> int:
        return t

    def _meta(self, t: int) -> AttentionMetadata:
        return AttentionMetadata(self.slots[:t], self.block_tables, self.qsl, self.seq_lens,
                                 max_query_len=t, max_seq_len=self.max_model_len)

    def _finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden   # the LM head runs after the replay, on the logit rows only

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first (the pool's peak is set by the first capture)."""
        t0 = time.monotonic()
        # the capture's warm-up and the captured run write KV through slots: keep them at -1
        self.slots.fill_(-1)
        self.qsl.zero_()
        self.seq_lens.zero_()
        self._capture_all(list(reversed(self.buckets)))
        log.info("captured %d ragged CUDA graphs (tokens %s, <= %d requests) for %s in %.1fs",
                 len(self.graphs), "/".join(map(str, self.buckets)), self.max_reqs,
                 self.model.spec.architecture, time.monotonic() - t0)

    def _stage(self, items: list[ForwardItem]) -> tuple[int, list[int]]:
        """Copy the batch into the static buffers, padded; returns its token bucket and the
        rows whose logits are wanted."""
        flat = flatten(items, self.block_size)
        n = len(flat.ids)
        t = next(b for b in self.buckets if b >= n)
        dev = self.input_ids.device
        tables = host_buffer(tuple(self.block_tables.shape), torch.int32, dev)
        fill_rows(tables, [it.block_ids for it in items])
        pad_tokens, pad_reqs = t - n, self.max_reqs - len(items)
        # rows of no request: token 0 at position 0, no KV write (slot -1); requests past the
        # batch's: zero-length, starting after the last real token
        for buf, values, pad, dtype in (
                (self.input_ids[:t], flat.ids, [0] * pad_tokens, torch.int64),
                (self.positions[:t], flat.positions, [0] * pad_tokens, torch.int64),
                (self.slots[:t], flat.slots, [-1] * pad_tokens, torch.int64),
                (self.qsl, flat.qsl, [n] * pad_reqs, torch.int32),
                (self.seq_lens, flat.seq_lens, [0] * pad_reqs, torch.int32)):
            buf.copy_(host_tensor(values + pad, dtype, dev), non_blocking=True)
        self.block_tables.copy_(tables, non_blocking=True)
        return t, flat.logit_rows

    @torch.inference_mode()
    def run(self, items: list[ForwardItem]) -> Optional[torch.Tensor]:
        """Logits [sum(num_logits), V] of ``items`` (None when none wants logits)."""
        t, rows = self._stage(items)
        if t in self.graphs:
            for graph in self.graphs[t]:
                graph.replay()
            hidden = self.outputs[t]
        else:
            pieces, outs = self._pieces(t)
            for piece in pieces:
                piece()
            hidden = outs[-1]
        if not rows:
            return None
        index = to_device(rows, torch.int64, hidden.device)
        return self.model.compute_logits(hidden.index_select(0, index), rows=hidden.shape[0])
