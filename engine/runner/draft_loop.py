"""The draft's k proposal passes as one device program, replayed as CUDA graphs.

Input per request: its last two committed tokens, their position, how many drafts it takes
(``k``, at most ``k_max``), its block table and sampling parameters. The program runs the
2-token catch-up pass and samples draft 1, then k - 1 one-token passes, each fed the tokens the
previous pass sampled. Positions, KV slots, sequence lengths and next inputs are computed on the
device, so the host copies the inputs once, launches the program and reads the [B, k] draft
table once: no Python round trip per pass. A request taking fewer than k drafts (near its
max_tokens or the context end) rides along: its surplus passes write no KV, attend to one
position and their tokens are dropped. Padding rows (up to the batch bucket) take 0 drafts.

Two ways in. ``run`` takes the inputs from the host (after the sampled tokens were read).
``launch_chained`` starts straight behind the rejection sampler: the host loads what it knows
before verification (last token, length, draft room) and a few device ops add what the sampler
accepted (the catch-up tokens, their position, the drafts still allowed), so the step reads the
host once, for the sampled tokens and the drafts together.

On CUDA the program is captured per batch bucket as k + 1 graphs: the catch-up pass split after
its first layers (the GPU starts while the host launches the rest, see cuda_graphs.py), then one
graph per pass. Elsewhere (CPU, ``--enforce-eager``) the same code runs eagerly, padded to the
same buckets, so the CPU tests run exactly what the graphs capture.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch

from specserve.engine.models.llama import AttentionMetadata, KVCache, LlamaFamilyModel
from specserve.engine.request import Request
from specserve.engine.runner.cuda_graphs import buckets_up_to, capture_pieces, first_piece_layers
from specserve.engine.runner.sampling_inputs import host_fields
from specserve.engine.runner.transfer import fill_rows, host_buffer
from specserve.kernels import ops

log = logging.getLogger("specserve.runner")

# rows of the int64 input buffer [8, max_batch]; _CAP: the drafts the controller allows the row
_ID0, _ID1, _START, _NUM_DRAFTS, _TOP_K, _SEED, _POSITION, _CAP = range(8)
# rows of the fp32 input buffer [3, max_batch]
_TEMPERATURE, _TOP_P, _MIN_P = range(3)


@dataclass
class LoopRow:
    """One request's proposal."""

    request: Request
    last_two: list[int]      # the last two committed tokens (the catch-up pass feeds them)
    start: int               # absolute position of last_two[0]
    k: int                   # drafts to propose, 1..k_max
    position: int            # output index draft 1 will occupy (its RNG key)


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits [M, V_draft] -> [M, vocab]: a wider (padded) draft vocabulary is cut, a
    narrower one is padded with -inf (ids the draft cannot produce are never drafted)."""
    if logits.shape[1] > vocab:
        return logits[:, :vocab].contiguous()
    if logits.shape[1] < vocab:
        pad = logits.new_full((logits.shape[0], vocab - logits.shape[1]), float("-inf"))
        return torch.cat([logits, pad], dim=1)
    return logits


class DraftLoop:
    """Static buffers and (on CUDA) the captured graphs of the proposal program."""

    def __init__(self, model: LlamaFamilyModel, kv: list[KVCache], k_max: int, vocab: int,
                 max_batch: int, max_blocks: int, max_model_len: int, block_size: int,
                 store_probs: bool, greedy: bool, stream: int, device: torch.device):
        self.model, self.kv, self.k_max, self.vocab = model, kv, k_max, vocab
        self.block_size, self.max_model_len = block_size, max_model_len
        self.store_probs, self.greedy, self.device = store_probs, greedy, device
        self.stream = stream   # the Philox stream of the drafts' races (SpecSettings.draft_stream)
        self.buckets = buckets_up_to(max_batch)
        bmax = self.buckets[-1]
        self.ints = torch.zeros((8, bmax), dtype=torch.int64, device=device)
        self.floats = torch.ones((3, bmax), dtype=torch.float32, device=device)
        self.block_tables = torch.zeros((bmax, max_blocks), dtype=torch.int32, device=device)
        self.tokens = torch.zeros((bmax, k_max), dtype=torch.int64, device=device)   # [B, k]
        # [k, B, V]: pass j writes the contiguous slab probs[j, :b]
        self.probs = (torch.zeros((k_max, bmax, vocab), dtype=torch.float32, device=device)
                      if store_probs else None)
        self.qsl = torch.arange(0, 2 * (bmax + 1), dtype=torch.int32, device=device)  # step 1 or 2
        layers = model.spec.num_layers
        self.head_layers = min(first_piece_layers(layers), layers)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self._kept: dict[int, list] = {}   # tensors the captured pieces hand to each other
        self._pool = None

    @staticmethod
    def probs_bytes(k_max: int, max_batch: int, vocab: int) -> int:
        """Device memory of the draft-probability buffer (sized at start-up with the KV cache)."""
        return k_max * buckets_up_to(max_batch)[-1] * vocab * 4

    # ---- the program -------------------------------------------------------------------------
    def _slots(self, b: int, pos: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """KV slot of each position ``pos [b, n]`` in its row's blocks; -1 where not ``active``."""
        bs, width = self.block_size, self.block_tables.shape[1]
        col = torch.clamp(pos // bs, max=width - 1)
        block = torch.gather(self.block_tables[:b].long(), 1, col)
        return torch.where(active, block * bs + pos % bs, -1).reshape(-1)

    def _catch_up_head(self, b: int) -> tuple:
        """First layers of the 2-token pass over every row's last two committed tokens."""
        ints = self.ints
        start = ints[_START, :b]
        pos = start.unsqueeze(1) + torch.arange(2, device=self.device)           # [b, 2]
        slots = self._slots(b, pos, (ints[_NUM_DRAFTS, :b] > 0).unsqueeze(1))
        meta = AttentionMetadata(slots, self.block_tables[:b], self.qsl[:b + 1] * 2,
                                 (start + 2).to(torch.int32), 2, self.max_model_len)
        ids = ints[_ID0:_ID1 + 1, :b].t().reshape(-1)                              # [2b]
        positions = pos.reshape(-1)
        x, residual = self.model.run_layers(self.model.embed_tokens(ids), None, positions, meta,
                                            self.kv, 0, self.head_layers)
        return x, residual, positions, meta

    def _catch_up_tail(self, b: int, carried: tuple) -> None:
        """The remaining layers of the catch-up pass, then draft 1 from each row's last position."""
        x, residual, positions, meta = carried
        model = self.model
        x, residual = model.run_layers(x, residual, positions, meta, self.kv, self.head_layers,
                                       model.spec.num_layers)
        x, residual = x[1::2].contiguous(), residual[1::2].contiguous()           # row r: 2r + 1
        self._sample(b, 0, model.compute_logits(model.final_norm(x, residual)))

    def _pass(self, b: int, j: int) -> None:
        """Pass j (1..k-1): feed draft j at its position, sample draft j + 1."""
        ints, model = self.ints, self.model
        active = ints[_NUM_DRAFTS, :b] > j                                          # [b]
        pos = ints[_START, :b] + 1 + j
        slots = self._slots(b, pos.unsqueeze(1), active.unsqueeze(1))
        seq_lens = torch.where(active, pos + 1, 1).to(torch.int32)
        meta = AttentionMetadata(slots, self.block_tables[:b], self.qsl[:b + 1], seq_lens, 1,
                                 self.max_model_len)
        ids = self.tokens[:b, j - 1].contiguous()
        x, residual = model.run_layers(model.embed_tokens(ids), None, torch.where(active, pos, 0),
                                       meta, self.kv, 0, model.spec.num_layers)
        self._sample(b, j, model.compute_logits(model.final_norm(x, residual)))

    def _sample(self, b: int, j: int, logits: torch.Tensor) -> None:
        f, i = self.floats, self.ints
        out = self.probs[j, :b] if self.probs is not None else None
        tokens, _ = ops.sample_draft(fit_vocab(logits, self.vocab), f[_TEMPERATURE, :b],
                                     i[_TOP_K, :b], f[_TOP_P, :b], f[_MIN_P, :b], i[_SEED, :b],
                                     i[_POSITION, :b] + j, self.store_probs, probs_out=out,
                                     stream=self.stream)
        self.tokens[:b, j].copy_(tokens)

    def _pieces(self, b: int) -> tuple[list, list]:
        """The program for bucket ``b`` as callables, each the body of one graph, and the list
        through which the catch-up's two pieces hand over their state."""
        carried: list = []
        pieces = [lambda: carried.append(self._catch_up_head(b)),
                  lambda: self._catch_up_tail(b, carried[-1])]
        pieces += [lambda j=j: self._pass(b, j) for j in range(1, self.k_max)]
        return pieces, carried

    # ---- capture and run ---------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.monotonic()
        for b in reversed(self.buckets):
            self.graphs[b], self._kept[b], self._pool = capture_pieces(lambda: self._pieces(b),
                                                                       self._pool)
        torch.cuda.synchronize()
        log.info("captured the draft's proposal program (%d graphs each, k=%d) for %d batch buckets "
                 "<= %d in %.1fs", self.k_max + 1, self.k_max, len(self.graphs), self.buckets[-1],
                 time.monotonic() - t0)

    def fits(self, num_rows: int) -> bool:
        return 0 < num_rows <= self.buckets[-1]

    @torch.inference_mode()
    def run(self, rows: list[LoopRow]) -> tuple[list[list[int]], list[Optional[torch.Tensor]]]:
        """Drafts of each row (``k`` tokens) and, when probabilities are stored, each row's q as
        a [k, V] fp32 tensor (see :meth:`collect`)."""
        n = len(rows)
        lead = [[r.last_two[0] for r in rows], [r.last_two[1] for r in rows],
                [r.start for r in rows], [r.k for r in rows]]
        b = self._load([r.request for r in rows], [r.position for r in rows], lead,
                       [r.k for r in rows])
        self._launch(b, max(r.k for r in rows))
        table = self.tokens[:n].tolist()   # the draft's one host read of the step
        return self.collect(table, [r.k for r in rows])

    @torch.inference_mode()
    def launch_chained(self, requests: list[Request], verified: torch.Tensor,
                       max_model_len: int, caps: list[int]) -> None:
        """Start the program from a verification whose output ``verified`` [B, w] (accepted
        drafts, then one recovered or bonus token, -1 padding; row i is ``requests[i]``) is still
        on the device. Each request must be in step with the draft: whatever it accepts, its
        catch-up is the last two committed tokens. The caller reads ``tokens[:B]`` together with
        ``verified``, then calls :meth:`collect` with ``spec_budget`` drafts per row. ``caps``:
        the most drafts each row may take this step (the adaptive controller's k; 0 = none)."""
        n = len(requests)
        # host values before this step's tokens; the device adds what verification accepted
        lead = [[r.token_ids[-1] for r in requests], [0] * n, [r.num_tokens for r in requests],
                [r.draft_room(max_model_len) for r in requests]]
        b = self._load(requests, [r.num_output_tokens for r in requests], lead, caps)
        ints = self.ints
        new = (verified >= 0).sum(1)                                        # [B] tokens committed
        ext = torch.cat([ints[_ID0, :n].unsqueeze(1), verified], 1)         # [B, 1 + w]
        ints[_ID0:_ID1 + 1, :n] = torch.cat([ext.gather(1, (new - 1).unsqueeze(1)),
                                             ext.gather(1, new.unsqueeze(1))], 1).t()
        ints[_START, :n] += new - 2
        ints[_NUM_DRAFTS, :n] = torch.clamp(torch.minimum(ints[_NUM_DRAFTS, :n] - new, ints[_CAP, :n]),
                                            0, self.k_max)
        ints[_POSITION, :n] += new
        # at least one token is committed, so no row takes more than room - 1 drafts
        self._launch(b, max(min(self.k_max, cap, r.draft_room(max_model_len) - 1)
                            for r, cap in zip(requests, caps)))

    def collect(self, table: list[list[int]], ks: list[int]
                ) -> tuple[list[list[int]], list[Optional[torch.Tensor]]]:
        """Each row's first ``k`` drafts (``ks``) from the read ``table`` and, when probabilities
        are stored, their q [k, V]: views into one copy of the batch's rows (the next run
        overwrites the buffer). A copy per row cost a launch and an allocation each, ~0.9 ms of
        host time a step at batch 64 on an H100 (cProfile); a request preempted keeps a copy of
        its own instead of the batch's (``Scheduler._preempt``). When most rows take fewer
        drafts than the longest (adaptive per-row budgets near max_tokens), rows are copied one
        by one instead, so that the copy is not mostly padding.

        The copy is request-major ([B, k, V]): each request's rows lie together, one request
        after another, so a verification of the whole batch in this order reads them as one
        view instead of concatenating them again (``verifier._gather_draft_probs``)."""
        drafts = [t[:k] for t, k in zip(table, ks)]
        k_most = max(ks, default=0)
        if self.probs is None or k_most == 0:
            return drafts, [None] * len(drafts)
        if 2 * sum(ks) < k_most * len(ks):   # mostly short rows: a batch copy would be mostly waste
            return drafts, [self.probs[:k, i].clone() if k else None for i, k in enumerate(ks)]
        # a copy always (with k = 1 the transposed slice is contiguous already, and .contiguous()
        # would hand out views of the buffer the next run overwrites)
        rows = self.probs[:k_most, :len(ks)].transpose(0, 1).clone(
            memory_format=torch.contiguous_format).unbind(0)   # [k, V] each
        return drafts, [q if k == k_most else (q[:k] if k else None) for q, k in zip(rows, ks)]

    def _load(self, requests: list[Request], positions: list[int], lead: list[list[int]],
              caps: list[int]) -> int:
        """Copy the host inputs (the four leading int rows, sampling fields, draft caps, block
        tables) into the static buffers; returns the batch bucket."""
        n = len(requests)
        b = next(x for x in self.buckets if x >= n)
        dev = self.device
        ints = host_buffer((8, b), torch.int64, dev)
        floats = host_buffer((3, b), torch.float32, dev)
        tables = host_buffer((b, self.block_tables.shape[1]), torch.int32, dev)
        fl, it = host_fields(requests, positions, self.greedy)
        floats[:, :n] = torch.tensor(fl, dtype=torch.float32)
        floats[:, n:] = 1.0
        ints[_TOP_K:_CAP, :n] = torch.tensor(it, dtype=torch.int64)
        ints[_CAP, :n] = torch.tensor(caps, dtype=torch.int64)
        ints[:_TOP_K, :n] = torch.tensor(lead, dtype=torch.int64)
        fill_rows(tables, [req.block_ids for req in requests])
        self.ints[:, :b].copy_(ints, non_blocking=True)
        self.floats[:, :b].copy_(floats, non_blocking=True)
        self.block_tables[:b].copy_(tables, non_blocking=True)
        return b

    def _launch(self, b: int, k: int) -> None:
        """Run the program up to draft ``k`` (the most any row takes): near max_tokens
        every row may take fewer than k, and the passes no row needs are skipped."""
        if k <= 0:
            return
        upto = k + 1                     # the catch-up's two pieces, then passes 2..
        if b in self.graphs:
            for graph in self.graphs[b][:upto]:
                graph.replay()
        else:
            for piece in self._pieces(b)[0][:upto]:
                piece()
