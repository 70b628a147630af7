"""Owns the models and their KV caches and executes one scheduled step.

Step order: target forward over every scheduled token (prefill chunks, decodes and
verifications in one ragged batch) -> logits processing -> one rejection-sampler call for all
requests that sample -> the draft model catches up and proposes the next drafts.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from specserve.engine.batch import ModelRunnerOutput, SchedulerOutput
from specserve.engine.models.llama import KVCache, LlamaFamilyModel
from specserve.engine.models.spec import ModelSpec
from specserve.engine.runner.cuda_graphs import GraphedForward, verify_widths
from specserve.engine.runner.draft_loop import DraftLoop, fit_vocab
from specserve.engine.runner.drafter import can_chain, chain, finish_chained, propose
from specserve.engine.runner.inputs import ForwardItem, build_inputs
from specserve.engine.runner.phase_clock import PhaseClock
from specserve.engine.runner.verifier import Verification, start_verification
from specserve.kernels import ops

log = logging.getLogger("specserve.runner")


def allocate_kv(spec: ModelSpec, num_blocks: int, block_size: int, dtype: torch.dtype,
                device: torch.device) -> list[KVCache]:
    shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(spec.num_layers)]


class ModelRunner:
    def __init__(self, target: LlamaFamilyModel, draft: Optional[LlamaFamilyModel], num_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device, num_spec: int,
                 max_model_len: int, rejection_method: str, draft_sample_method: str,
                 max_num_seqs: int = 64, enforce_eager: bool = True, tp=None):
        self.target, self.draft = target, draft
        self.tp = tp   # TPDriver when the target is split over ranks (engine/distributed/), else None
        self.block_size = block_size
        self.device = device
        self.num_spec = num_spec if draft is not None else 0
        self.max_model_len = max_model_len
        self.rejection_method = rejection_method
        self.store_draft_probs = draft_sample_method == "sample"
        self.vocab_size = target.spec.vocab_size
        self.target_kv = allocate_kv(getattr(target, "kv_spec", target.spec), num_blocks, block_size, dtype, device)
        self.draft_kv = allocate_kv(draft.spec, num_blocks, block_size, dtype, device) if draft else []
        self.graphs: dict[tuple[str, int], GraphedForward] = {}
        max_blocks = min(num_blocks, -(-(max_model_len + self.num_spec + 1) // block_size))
        self.draft_loop: Optional[DraftLoop] = None
        if self.num_spec:
            self.draft_loop = DraftLoop(draft, self.draft_kv, self.num_spec, self.vocab_size,
                                        max_num_seqs, max_blocks, max_model_len, block_size,
                                        self.store_draft_probs, not self.store_draft_probs, device)
        if device.type == "cuda" and not enforce_eager:
            self._capture_graphs(max_num_seqs, max_blocks)
        if device.type == "cuda":
            self._warm_up_sampling(max_num_seqs, dtype)

    def _warm_up_sampling(self, max_num_seqs: int, dtype: torch.dtype) -> None:
        """Compile the sampler's kernel variants now rather than in the middle of traffic."""
        t0 = time.monotonic()
        calls = ops.warm_up_sampling(self.vocab_size, max_num_seqs, self.num_spec, self.rejection_method,
                                     self.store_draft_probs and self.num_spec > 0,
                                     self.store_draft_probs, dtype, self.device)
        if calls:
            log.info("warmed up %d sampling kernel variants in %.1fs", calls, time.monotonic() - t0)

    def _capture_graphs(self, max_num_seqs: int, max_blocks: int) -> None:
        plan = [("target", self.target, self.target_kv, 1)]
        if self.num_spec:   # verification widths (adaptive k pads to the next one), draft passes
            plan += [("target", self.target, self.target_kv, q) for q in verify_widths(self.num_spec)]
            plan += [("draft", self.draft, self.draft_kv, 1)]   # passes with logits processors
        pool = None   # one memory pool for every forward graph: they never run at once
        for name, model, kv, q in plan:
            g = GraphedForward(model, kv, q, max_num_seqs, max_blocks, self.max_model_len,
                               self.block_size, self.device)
            g.pool = pool
            g.capture()
            pool = g.pool
            self.graphs[(name, q)] = g
        if self.draft_loop is not None:
            self.draft_loop.capture()

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        clock = PhaseClock(self.device)
        t0 = clock.mark()
        items = []
        for s in so.scheduled:
            req = s.request
            start = s.num_computed_before
            tokens = (req.token_ids + req.draft_token_ids)[start:start + s.num_new_tokens]
            items.append(ForwardItem(tokens, start, req.block_ids, s.num_drafts + 1 if s.samples else 0))
        logits = self._forward("target", items)
        sampling = [s for s in so.scheduled if s.samples]
        results = {}
        if sampling:
            v = start_verification(sampling, logits, self.rejection_method,
                                   self.store_draft_probs and self.num_spec > 0, self.device)
            if any(s.num_spec_next for s in sampling) and can_chain(sampling, self.draft_loop):
                return self._chained_drafts(so, v, clock, t0)
            results = v.finish(v.out.tolist())   # the target's read; the drafts are read later
        t1 = clock.mark()
        drafted = self.draft is not None and self.num_spec > 0
        if drafted:
            propose(so.scheduled, results, self._draft_forward, self.draft_loop, self.num_spec,
                    self.max_model_len, self.store_draft_probs, not self.store_draft_probs,
                    self.device)
        t2 = clock.mark() if drafted else t1
        return ModelRunnerOutput(results, clock.seconds(t0, t1), clock.seconds(t1, t2))

    def _chained_drafts(self, so: SchedulerOutput, v: Verification, clock: PhaseClock,
                        t0) -> ModelRunnerOutput:
        """The draft program starts behind the verification on the device; the step's one host
        read brings the sampled tokens and the new drafts together."""
        loop = self.draft_loop
        t1 = clock.mark()
        results = chain(so.scheduled, v.out, self._draft_forward, loop, self.max_model_len)
        t2 = clock.mark()
        width = v.out.shape[1]
        rows = torch.cat([v.out, loop.tokens[:len(v.sampling)]], 1).tolist()  # the one read
        results.update(v.finish([r[:width] for r in rows]))
        finish_chained(v.sampling, results, [r[width:] for r in rows], loop, self.num_spec,
                       self.max_model_len)
        return ModelRunnerOutput(results, clock.seconds(t0, t1), clock.seconds(t1, t2))

    def _forward(self, which: str, items: list[ForwardItem]) -> Optional[torch.Tensor]:
        """Logits [sum(num_logits), V] for ``items`` (None when no item wants logits)."""
        if self.tp is not None and which == "target":
            self.tp.send(items)   # the other ranks run their shard of this forward with us
        graph = self._graph_for(which, items)
        if graph is not None:
            return graph.run(items)
        model, kv = (self.target, self.target_kv) if which == "target" else (self.draft, self.draft_kv)
        bound = self.max_model_len if self.device.type == "cuda" else None
        inputs = build_inputs(items, self.block_size, self.device, bound)
        hidden = model(inputs.input_ids, inputs.positions, inputs.meta, kv)
        if inputs.logits_indices.numel() == 0:
            return None
        return model.compute_logits(hidden[inputs.logits_indices])   # [rows, V]

    def _graph_for(self, which: str, items: list[ForwardItem]) -> Optional[GraphedForward]:
        """The smallest captured graph whose query length covers every item, if any."""
        if not self.graphs or not items:
            return None
        longest = max(len(it.token_ids) for it in items)
        for q in sorted(q for (w, q) in self.graphs if w == which):
            if q >= longest:
                graph = self.graphs[(which, q)]
                return graph if graph.fits(items) else None
        return None

    def _draft_forward(self, items: list[ForwardItem]) -> Optional[torch.Tensor]:
        logits = self._forward("draft", items)
        return None if logits is None else fit_vocab(logits, self.vocab_size)
