"""Owns the models and their KV caches and executes one scheduled step.

Step order: target forward over every scheduled token (prefill chunks, decodes and
verifications in one ragged batch), then the ``Speculator`` (speculator.py): logits processing,
one rejection-sampler call for all requests that sample, and the draft model's catch-up and next
drafts (drafter.py, with the device program of draft_loop.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch

from specserve.engine.batch import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from specserve.engine.models.llama import KVCache, LlamaFamilyModel
from specserve.engine.models.spec import ModelSpec
from specserve.engine.runner.cuda_graphs import GraphedForward, forward_graph_plan
from specserve.engine.runner.draft_loop import DraftLoop, fit_vocab
from specserve.engine.runner.drafter import Drafter
from specserve.engine.runner.inputs import ForwardItem, build_inputs
from specserve.engine.runner.host_read import HostRead
from specserve.engine.runner.launched import LaunchedDecode, LaunchedStep
from specserve.engine.runner.phase_clock import PhaseClock
from specserve.engine.runner.ragged_graphs import RaggedGraphedForward
from specserve.engine.runner.settings import SpecSettings
from specserve.engine.runner.speculator import Speculator
from specserve.engine.runner.verifier import start_verification
from specserve.engine.runner.warmup import warm_up_eager
from specserve.kernels import ops

log = logging.getLogger("specserve.runner")


@dataclass(frozen=True)
class KVLayout:
    """The paged KV cache both models share the block ids of."""

    num_blocks: int
    block_size: int
    dtype: torch.dtype
    device: torch.device


def allocate_kv(spec: ModelSpec, layout: KVLayout) -> list[KVCache]:
    shape = (layout.num_blocks, layout.block_size, spec.num_kv_heads, spec.head_dim)
    return [(torch.zeros(shape, dtype=layout.dtype, device=layout.device),
             torch.zeros(shape, dtype=layout.dtype, device=layout.device))
            for _ in range(spec.num_layers)]


class ModelRunner:
    def __init__(self, target: LlamaFamilyModel, draft: Optional[LlamaFamilyModel], layout: KVLayout,
                 spec: SpecSettings, max_num_seqs: int = 64, enforce_eager: bool = True, tp=None,
                 max_step_tokens: Optional[int] = None, ragged_graph_tokens: int = 0):
        """``max_step_tokens``: the scheduler's token budget per step (--max-num-batched-tokens),
        the largest forward the start-up warm-up may run (None: bounded by the cache only).
        ``ragged_graph_tokens``: forwards of up to this many tokens that no uniform graph fits
        (prefill chunks, mixed steps, catch-ups) replay ragged CUDA graphs (ragged_graphs.py)
        when graphs are captured at all; 0 runs them eagerly."""
        if (draft is None) != (spec.num_speculative_tokens == 0):
            raise ValueError("a draft model needs num_speculative_tokens > 0, and k > 0 needs a draft")
        self.target, self.draft = target, draft
        self.tp = tp   # TPDriver when the target is split over ranks (engine/distributed/), else None
        self.spec = spec
        self.block_size, self.device = layout.block_size, layout.device
        self.max_model_len = spec.max_model_len
        self.vocab_size = target.spec.vocab_size
        self.target_kv = allocate_kv(getattr(target, "kv_spec", target.spec), layout)
        self.draft_kv = allocate_kv(draft.spec, layout) if draft else []
        self.graphs: dict[tuple[str, int], GraphedForward] = {}
        self.ragged: dict[str, RaggedGraphedForward] = {}
        k_max = spec.num_speculative_tokens
        max_blocks = min(layout.num_blocks, -(-(spec.max_model_len + k_max + 1) // layout.block_size))
        drafter = None
        if draft is not None:
            loop = DraftLoop(draft, self.draft_kv, k_max, self.vocab_size, max_num_seqs, max_blocks,
                             spec.max_model_len, layout.block_size, spec.store_probs, spec.greedy_drafts,
                             spec.draft_stream, layout.device)
            drafter = Drafter(self._draft_forward, loop, spec, layout.device)
        self.speculator = Speculator(spec, drafter, layout.device)
        if layout.device.type == "cuda" and not enforce_eager:
            pool = self._capture_graphs(max_num_seqs, max_blocks)
            self._capture_ragged(ragged_graph_tokens, max_step_tokens, max_num_seqs, max_blocks, pool)
        if layout.device.type == "cuda":
            self._warm_up_sampling(max_num_seqs, layout.dtype)
            warm_up_eager(self, min(16, max_num_seqs), max_tokens=max_step_tokens)

    @property
    def num_speculative_tokens(self) -> int:
        return self.spec.num_speculative_tokens

    @property
    def draft_loop(self) -> Optional[DraftLoop]:
        """The draft's device program (None without a draft model)."""
        drafter = self.speculator.drafter
        return None if drafter is None else drafter.loop

    def _warm_up_sampling(self, max_num_seqs: int, dtype: torch.dtype) -> None:
        """Compile the sampler's kernel variants now rather than in the middle of traffic."""
        t0 = time.monotonic()
        calls = ops.warm_up_sampling(self.vocab_size, max_num_seqs, *self.spec.sampler_warm_up,
                                     dtype, self.device)
        if calls:
            log.info("sampling kernels: warm-up of %d calls in %.1fs (compiling what Triton's cache "
                     "lacks)", calls, time.monotonic() - t0)

    def _model_kv(self, which: str) -> tuple[LlamaFamilyModel, list[KVCache]]:
        """The model called ``which`` ("target" or "draft") and its KV cache."""
        return (self.target, self.target_kv) if which == "target" else (self.draft, self.draft_kv)

    def _capture_graphs(self, max_num_seqs: int, max_blocks: int):
        """The decode, the verification widths (adaptive k pads to the next one) and the draft's
        passes with logits processors; returns their memory pool."""
        pool = None   # one memory pool for every forward graph: they never run at once
        for name, q in forward_graph_plan(self.num_speculative_tokens):
            g = GraphedForward(*self._model_kv(name), q, max_num_seqs, max_blocks, self.max_model_len,
                               self.block_size, self.device)
            g.pool = pool
            g.capture()
            pool = g.pool
            self.graphs[(name, q)] = g
        if self.draft_loop is not None:
            self.draft_loop.capture()
        return pool

    def _capture_ragged(self, max_tokens: int, max_step_tokens: Optional[int], max_num_seqs: int,
                        max_blocks: int, pool) -> None:
        """Ragged graphs for the target (up to the step's token budget) and the draft (whose
        catch-up the budget does not cut), in the uniform graphs' memory pool ``pool``."""
        sizes = {"target": min(max_tokens, max_step_tokens or max_tokens)}
        if self.draft is not None:
            sizes["draft"] = max_tokens
        for name, tokens in sizes.items():
            if tokens <= 0:
                continue
            g = RaggedGraphedForward(*self._model_kv(name), tokens, max_num_seqs, max_blocks,
                                     self.max_model_len, self.block_size, self.device)
            g.pool = pool
            g.capture()
            pool = g.pool
            self.ragged[name] = g

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """The target forward over every scheduled token, then the speculator's sampling half."""
        return self.launch(so).collect()

    @torch.inference_mode()
    def launch(self, so: SchedulerOutput) -> LaunchedStep:
        """:meth:`execute` up to its first host read: the target forward and the sampler are
        queued (and the draft program behind them when it can chain); ``collect`` reads the
        tokens and finishes the step. Nothing may change the scheduled requests in between."""
        clock = PhaseClock(self.device)
        t0 = clock.mark()
        logits = self._forward("target", self._items(so.scheduled))
        finish, sampled = self.speculator.launch(so.scheduled, logits, clock)
        return LaunchedStep(finish, clock, t0, sampled)

    @staticmethod
    def _items(scheduled: list[ScheduledRequest]) -> list[ForwardItem]:
        items = []
        for s in scheduled:
            req = s.request
            start = s.num_computed_before
            tokens = (req.token_ids + req.draft_token_ids)[start:start + s.num_new_tokens]
            items.append(ForwardItem(tokens, start, req.block_ids, s.k + 1 if s.samples else 0))
        return items

    @torch.inference_mode()
    def launch_decode(self, scheduled: list[ScheduledRequest],
                      after: Optional[LaunchedDecode] = None) -> LaunchedDecode:
        """Queue a step in which every request samples one token and nothing is drafted, and
        return without reading its tokens (``LaunchedDecode.collect`` does).

        ``after``: a launched step not yet collected that every one of ``scheduled`` continues
        (one token each, at the position after it). Their input tokens are the ones ``after``
        sampled, taken on the device, and their sampling positions are one output further on
        than their host-side token lists say, since ``after``'s tokens are not appended yet."""
        clock = PhaseClock(self.device)
        t0 = clock.mark()
        if after is None:
            items, ids = self._items(scheduled), None
        else:
            items = [ForwardItem([0], s.num_computed_before, s.request.block_ids, 1) for s in scheduled]
            ids = after.sampled_on_device([s.request for s in scheduled])
        logits = self._forward("target", items, ids)
        v = start_verification(scheduled, logits, self.spec.rejection_method, self.spec.store_probs,
                               self.device, output_offset=0 if after is None else 1)
        t1 = clock.mark()
        return LaunchedDecode(v, HostRead(v.out), clock, (t0, t1))

    def _forward(self, which: str, items: list[ForwardItem],
                 input_ids: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """Logits [sum(num_logits), V] for ``items`` (None when no item wants logits).
        ``input_ids``: one-token items' tokens as a device tensor, replacing their token_ids."""
        if self.tp is not None and which == "target":
            if input_ids is not None:
                raise ValueError("the tensor-parallel ranks read token ids from the host")
            self.tp.send(items)   # the other ranks run their shard of this forward with us
        graph = self._graph_for(which, items)
        if graph is not None:
            return graph.run(items, input_ids)
        ragged = self.ragged.get(which)
        if ragged is not None and input_ids is None and ragged.fits(items):
            return ragged.run(items)
        model, kv = self._model_kv(which)
        bound = self.max_model_len if self.device.type == "cuda" else None
        inputs = build_inputs(items, self.block_size, self.device, bound)
        if input_ids is not None:
            inputs.input_ids = input_ids
        hidden = model(inputs.input_ids, inputs.positions, inputs.meta, kv)
        if inputs.logits_indices.numel() == 0:
            return None
        return model.compute_logits(hidden[inputs.logits_indices], rows=hidden.shape[0])   # [rows, V]

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
