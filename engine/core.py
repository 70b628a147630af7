"""EngineCore: admission, one synchronous step, and turning results into RequestOutputs.

Used from one thread only (the async engine's step thread, or the caller of ``LLM.generate``).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from specserve.engine.batch import RequestResult, SchedulerOutput, still_running
from specserve.engine.config import EngineConfig
from specserve.engine.decode_ahead import DecodeAhead
from specserve.engine.detokenizer import IncrementalDetokenizer, TokenPieces
from specserve.engine.errors import CapacityError
from specserve.engine.kv_cache import KVCacheManager
from specserve.engine.request import Request
from specserve.engine.runner.launched import LaunchedDecode, LaunchedStep
from specserve.engine.scheduler import Scheduler, SchedulerLimits
from specserve.engine.setup import EngineInfo, LoadedModels, load_models
from specserve.engine.spec_control import SpecControl
from specserve.engine.startup_traffic import run_startup_traffic
from specserve.engine.types import (CompletionOutput, FinishReason, GrowingView, Logprob, ParamError,
                          RequestOutput, SamplingParams, SpecDecodeStats, StepStats)
from specserve.kernels.compile_watch import watch_compiles

log = logging.getLogger("specserve.engine")

Launched = Union[LaunchedDecode, LaunchedStep]


@dataclass
class _Parent:
    """A caller's request: its ``n`` sequences share the prompt."""

    request_id: str
    prompt_token_ids: list[int]
    prompt_text: Optional[str]
    children: list[Request]
    final_only: bool = False   # the caller reads its final output only (``add_request``)


class EngineCore:
    def __init__(self, config: EngineConfig, models: Optional[LoadedModels] = None):
        self.config = config
        self.models = models or load_models(config)
        self.info: EngineInfo = self.models.info
        self.tokenizer = self.models.tokenizer
        info = self.info
        self.runner = self.models.runner
        self._parents: dict[str, _Parent] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._pieces = TokenPieces(self.tokenizer)   # byte-level tokenizers: one decode per token id
        self._logprobs: dict[str, list[Logprob]] = {}
        self._seed_rng = random.Random(config.seed)
        self._grammars = None   # structured.GrammarCompiler, built on the first constrained request
        self._draft_prob_bytes = 0  # as of the last step or abort (read by other threads)
        self.spec_control: Optional[SpecControl] = None   # built after the start-up traffic
        self.num_queued_steps = 0      # steps queued on the device before their call, so far (tests)
        self.decode_ahead: Optional[DecodeAhead] = None
        self._fresh_cache_and_scheduler()
        self._startup_traffic()
        ahead = config.async_scheduling and DecodeAhead.supported(self.runner)
        self.spec_control = _spec_control(config, info, self.runner, ahead)
        if ahead:
            self.decode_ahead = DecodeAhead(self.runner, self.scheduler, info.max_model_len,
                                            self.spec_control)
        if self.runner.device.type == "cuda":
            watch_compiles(_report_late_compile)

    def _fresh_cache_and_scheduler(self) -> None:
        config, info = self.config, self.info
        self.kv = KVCacheManager(info.num_kv_blocks, info.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerLimits(config.max_num_seqs, config.max_num_batched_tokens,
                                                   info.max_model_len, info.num_speculative_tokens), self.kv)
        self._queued = None   # a step queued by the last call (``_queue_next``), not read yet
        self._launch_seconds = 0.0   # the host time its queueing took
        self._launch_error: Optional[Exception] = None   # raised by the next call

    def _startup_traffic(self) -> None:
        """Synthetic requests first (CUDA): their compiles at start-up, not in the first real
        ones. Best effort: a failure is logged and start-up goes on. Then a fresh KV manager and
        scheduler, so that no prefix-cache entry of theirs survives (the adaptive calibration,
        next, writes blocks no request owns) and the first real request meets a cold engine."""
        try:
            if not run_startup_traffic(self):
                return   # nothing ran (CPU, tensor parallel, a context too short)
        except Exception:   # noqa: BLE001 (a warm-up must not keep the server from starting)
            log.exception("start-up traffic failed; serving without it (first requests may wait "
                          "for kernel compiles)")
            self.fail_all("start-up traffic failed")
        self._fresh_cache_and_scheduler()

    # ---- admission ---------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Raise ParamError if the request can never run; return its resolved max_tokens."""
        info = self.info
        if not prompt_token_ids:
            raise ParamError("prompt", "the prompt is empty")
        bad = [t for t in prompt_token_ids if not 0 <= t < info.vocab_size]
        if bad:
            raise ParamError("prompt", f"token id {bad[0]} is outside the vocabulary [0, {info.vocab_size})")
        n = len(prompt_token_ids)
        if n >= info.max_model_len:
            raise ParamError("prompt", f"this model's maximum context length is {info.max_model_len} tokens; "
                             f"the prompt has {n} tokens, leaving no room to generate")
        max_tokens = params.max_tokens
        if max_tokens is None:   # the model's default length (capped by the context), else the context
            room = info.max_model_len - n
            max_tokens = min(info.generation_defaults.get("max_tokens", room), room)
        if n + max_tokens > info.max_model_len:
            raise ParamError("max_tokens", f"this model's maximum context length is {info.max_model_len} "
                             f"tokens; you requested {n + max_tokens} ({n} in the prompt + "
                             f"{max_tokens} max_tokens)")
        if params.min_tokens > max_tokens:
            raise ParamError("min_tokens", f"min_tokens ({params.min_tokens}) exceeds the {max_tokens} tokens "
                             "this request can generate")
        if params.logit_bias:
            bad = [t for t in params.logit_bias if not 0 <= int(t) < info.vocab_size]
            if bad:
                raise ParamError("logit_bias", f"logit_bias token id {bad[0]} is outside the vocabulary")
        bad = [t for t in params.stop_token_ids if not 0 <= t < info.vocab_size]
        if bad:
            raise ParamError("stop_token_ids", f"stop token id {bad[0]} is outside the vocabulary")
        why = self.scheduler.capacity_error(n + max_tokens + info.num_speculative_tokens)
        if why:
            raise CapacityError("prompt", why)
        if params.structured_outputs is not None:
            self.grammar_compiler().compile(params.structured_outputs)   # ParamError if invalid
        return max_tokens

    def grammar_compiler(self):
        """The structured-output compiler for this tokenizer (built once, on first use)."""
        if self._grammars is None:
            from specserve.engine.structured.grammar import GrammarCompiler

            self._grammars = GrammarCompiler(self.tokenizer, self.info.vocab_size, self.info.eos_token_ids)
        return self._grammars

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt_text: Optional[str] = None, arrival: Optional[float] = None,
                    final_only: bool = False) -> None:
        """Queue a request. ``final_only``: ``step`` returns its output once, when every one of
        its sequences has finished, instead of a cumulative output after each step that gave it
        tokens (vLLM's FINAL_ONLY output kind: offline generation reads nothing in between, and
        building an output per request per step is host work on the critical path of a large
        batch). ``abort`` and ``fail_all`` return its output as for any request. The server does
        not ask for it: its metrics count tokens and time inter-token latency from the per-step
        outputs (server/metrics.py)."""
        if request_id in self._parents:
            raise ParamError("request_id", f"request id {request_id!r} is already in use")
        max_tokens = self.validate(prompt_token_ids, params)
        arrival = time.monotonic() if arrival is None else arrival
        children = []
        for i in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            seed = (params.seed + i) % 2**63 if params.seed is not None else self._seed_rng.getrandbits(63)
            req = Request(rid, prompt_token_ids, params, seed, self.info.eos_token_ids, max_tokens,
                          arrival, parent_id=request_id, index=i)
            self._detok[rid] = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.stop,
                                                      params.include_stop_str_in_output,
                                                      params.skip_special_tokens, self._pieces)
            if params.logprobs is not None:
                self._logprobs[rid] = []
            if params.structured_outputs is not None:
                req.grammar = self.grammar_compiler().new_state(params.structured_outputs)
            children.append(req)
        self._parents[request_id] = _Parent(request_id, list(prompt_token_ids), prompt_text, children,
                                            final_only)
        for req in children:
            self.scheduler.add(req)

    def abort(self, request_ids: Iterable[str]) -> list[RequestOutput]:
        """Abort whole caller requests; returns their final outputs."""
        outs = []
        for rid in request_ids:
            parent = self._parents.get(rid)
            if parent is None:
                continue
            for child in parent.children:
                self.scheduler.finish(child, FinishReason.ABORT)
            outs.append(self._output(parent))
            self._retire(parent)
        if not self._parents:   # a step queued for them holds its tensors until dropped
            self._drop_queued()
        self._draft_prob_bytes = self.draft_prob_bytes()
        return outs

    def _drop_queued(self) -> None:
        """Forget the step queued on the device, unread, and a failure to queue it (its requests
        are gone or failed)."""
        if self.decode_ahead is not None:
            self.decode_ahead.drop()
        if self.spec_control is not None:
            self.spec_control.reset()
        self._queued = self._launch_error = None

    def fail_all(self, message: str) -> list[RequestOutput]:
        """Finish every request with an error (the step loop hit an exception)."""
        self._drop_queued()
        outs = []
        for parent in list(self._parents.values()):
            for child in parent.children:
                if not child.is_finished:
                    child.error = message
                    self.scheduler.finish(child, FinishReason.ERROR)
            outs.append(self._output(parent))
            self._retire(parent)
        self._draft_prob_bytes = self.draft_prob_bytes()  # /debug/state must not show freed drafts
        return outs

    def has_unfinished(self) -> bool:
        return bool(self._parents)

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> tuple[list[RequestOutput], StepStats]:
        """Run one step and commit its tokens.

        With async scheduling the step run may have been queued by the previous call: once a
        step's tokens are committed (token lists, KV, finishes that need no text) the next step
        is scheduled and queued on the device, and only then does the host detokenize and build
        this step's outputs, while the GPU runs the next one (``_queue_next``). Decode-ahead
        (engine/decode_ahead.py) goes further for plain steps: the next one is queued before this
        one's tokens are read."""
        t0 = time.monotonic()
        if self._launch_error is not None:   # queueing this step failed in the call before
            error, self._launch_error = self._launch_error, None
            raise error
        # the host time this step's launch took in the call before (``_queue_next``, and
        # decode-ahead's ``launch_next``) is this step's, not that one's: the cost model learns
        # each step's k from its own work. On the CPU the launch runs the forward itself; charged
        # to the launching call, the last plain step before leaving k = 0 read ~0 and the first
        # after returning two forwards (scripts/plain_step_attribution.py)
        launch_seconds, self._launch_seconds = self._launch_seconds, 0.0
        queued = self._take_queued()
        if queued is None:
            launch_seconds = 0.0
        so, launched = queued or self._schedule(t0, launch=False)
        stats = StepStats(num_preemptions=self.scheduler.pop_preemption_count())
        stats.num_prefix_cache_queries, stats.num_prefix_cache_hits = self.scheduler.pop_prefix_counts()
        touched: dict[str, _Parent] = {}
        texts: list[tuple[IncrementalDetokenizer, list[int]]] = []   # detokenized after _queue_next
        ahead_seconds = 0.0   # planning and queueing the next step ahead: that step's host time
        if not so.is_empty:
            if isinstance(launched, LaunchedDecode):
                t_ahead = time.monotonic()
                self.decode_ahead.launch_next(so, launched)   # the GPU's next step, before this one is read
                ahead_seconds = time.monotonic() - t_ahead
            out = launched.collect() if launched is not None else self.runner.execute(so)
            stats.target_seconds, stats.draft_seconds = out.target_seconds, out.draft_seconds
            stats.host_wait_seconds = out.host_wait_seconds
            now = time.monotonic()
            self.scheduler.update_from_output(
                so, out, stats, lambda req, res: self._append_tokens(req, res, stats, now, texts))
            if self.spec_control is not None:
                self.spec_control.committed(so.scheduled)
            for s in so.scheduled:
                touched[s.request.parent_id] = self._parents[s.request.parent_id]
        self._fill_state(stats, so.num_scheduled_tokens)   # as this step left it, before the next
        decision = self.spec_control.applied if self.spec_control is not None else None
        t_queue = time.monotonic()
        try:
            self._queue_next()
        except Exception as e:   # noqa: BLE001 (raised by the next call, once this step's outputs are out)
            self._queued, self._launch_error = None, e
        self._launch_seconds = ahead_seconds + time.monotonic() - t_queue
        if self.spec_control is not None:
            # while the GPU runs the step just queued: this step's outcomes into the acceptance
            # model and, while drafting, the k of the step after it (SpecControl's docstring);
            # before the outputs, whose finished requests the controller then forgets
            queued = self._queued[0].scheduled if self._queued is not None else None
            try:
                self.spec_control.prepare_next(queued, waiting=len(self.scheduler.waiting))
            except Exception as e:   # noqa: BLE001 (like a failed launch: raised by the next call)
                self.spec_control.reset()
                if self._launch_error is None:
                    self._launch_error = e
        for detok, tokens in texts:
            for tok in tokens:
                detok.add(tok, check_stop=False)
        outputs = []
        for parent in touched.values():
            done = all(c.is_finished for c in parent.children)
            if done or not parent.final_only:
                outputs.append(self._output(parent))
            if done:
                self._retire(parent)
        stats.step_seconds = time.monotonic() - t0 - self._launch_seconds + launch_seconds
        if self.spec_control is not None:
            self.spec_control.after_step(so.scheduled, stats, decision)
        return outputs, stats

    def _schedule(self, now: float, launch: bool) -> tuple[SchedulerOutput, Optional[Launched]]:
        """The scheduler's next step, with each sampling request's k. Decode-ahead queues a step
        it can continue on the device; otherwise ``launch`` queues it as far as it goes without
        a host read (None: the caller executes it)."""
        so = self.scheduler.schedule()
        if self.spec_control is not None:
            # each sampling request's k for this step
            self.spec_control.plan(so.scheduled, waiting=len(self.scheduler.waiting))
        for s in so.scheduled:
            if s.request.times.first_scheduled is None:
                s.request.times.first_scheduled = now
        ahead = self.decode_ahead
        if ahead is not None and ahead.can_launch(so):
            return so, ahead.launch(so)
        return so, self.runner.launch(so) if launch and not so.is_empty else None

    def _take_queued(self) -> Optional[tuple[SchedulerOutput, Optional[Launched]]]:
        """The step queued by the last call (decode-ahead's or ``_queue_next``'s), less the
        requests finished (aborted) or preempted (tests do) since; None when there is none or
        none of it is left. A request preempted keeps nothing of it and samples the same
        positions again, with the same Philox keys, when it resumes."""
        if self.decode_ahead is not None:
            queued = self.decode_ahead.take()
            if queued is not None:
                return queued
        queued, self._queued = self._queued, None
        if queued is None:
            return None
        so, launched = queued
        if so.is_empty:
            return None   # nothing fitted when it was scheduled: schedule again (requests may have come)
        live = still_running(so.scheduled)
        if len(live) < len(so.scheduled):
            if not live:
                return None   # dropped unread: its device work wrote only blocks freed after it
            if isinstance(launched, LaunchedStep):   # no proposals for the gone from the host
                launched.dropped = {s.request.request_id for s in so.scheduled} - {
                    s.request.request_id for s in live}
            so = SchedulerOutput(live)
        return so, launched

    def _queue_next(self) -> None:
        """Schedule the next step and queue it on the device now, before this step's text and
        outputs are built (async scheduling). Every finish that this step's text could cause is
        already known: a request with stop strings was detokenized with its tokens
        (``_append_tokens``), so nothing the host does before the next call changes who runs
        next, except an abort, which ``_take_queued`` drops from the step."""
        ahead = self.decode_ahead
        if ahead is None:   # async scheduling off, tensor parallel, or the start-up traffic
            return
        if ahead.pending is not None:
            planned = ahead.take_planned()   # None: queued on the device already
            if planned is not None:   # planned with drafts behind a plain step: it starts now
                self._queued = (planned, self.runner.launch(planned))
                self.num_queued_steps += 1
            return
        if self.scheduler.running or self.scheduler.waiting:
            self._queued = self._schedule(time.monotonic(), launch=True)
            self.num_queued_steps += self._queued[1] is not None

    def _append_tokens(self, req: Request, res: RequestResult, stats: StepStats, now: float,
                       texts: list[tuple[IncrementalDetokenizer, list[int]]]) -> None:
        """Commit ``res.sampled`` to ``req`` up to a finish. A request without stop strings
        cannot finish on its text, so its tokens are detokenized later, once the next step is
        queued (appended to ``texts``)."""
        detok = self._detok[req.request_id]
        p = req.params
        later: Optional[list[int]] = None
        if not p.stop:
            later = []
            texts.append((detok, later))
        if req.times.first_token is None:
            req.times.first_token = now
        req.times.last_token = now
        eos = () if p.ignore_eos else req.eos_token_ids
        left = req.tokens_left(self.info.max_model_len)   # one less with each token appended
        for i, tok in enumerate(res.sampled):
            req.token_ids.append(tok)
            left -= 1
            stats.num_generation_tokens += 1
            if res.logprobs is not None:
                self._logprobs[req.request_id].append(res.logprobs[i])
            stop_tok = tok in eos or tok in p.stop_token_ids
            stop_str = None
            if not stop_tok or p.include_stop_str_in_output:  # a stop token's text is left out
                if later is not None:
                    later.append(tok)
                else:
                    stop_str = detok.add(tok, check_stop=req.num_output_tokens >= p.min_tokens)
            if tok in eos:
                self.scheduler.finish(req, FinishReason.STOP)
            elif tok in p.stop_token_ids:
                self.scheduler.finish(req, FinishReason.STOP, tok)
            elif stop_str is not None:
                self.scheduler.finish(req, FinishReason.STOP, stop_str)
            elif left <= 0:
                self.scheduler.finish(req, FinishReason.LENGTH)
            else:
                continue
            req.times.finished = now
            return

    # ---- outputs -----------------------------------------------------------------------
    def _output(self, parent: _Parent) -> RequestOutput:
        outs = []
        for req in parent.children:
            detok = self._detok[req.request_id]
            lps = self._logprobs.get(req.request_id)
            n_out = req.num_output_tokens
            outs.append(CompletionOutput(
                index=req.index, text=detok.visible_text(req.is_finished),
                token_ids=GrowingView(req.token_ids, req.prompt_len),
                logprobs=GrowingView(lps, 0, min(n_out, len(lps))) if lps is not None else None,
                finish_reason=req.finish_reason, stop_reason=req.stop_reason,
                spec_decode=_copy_spec(req.spec_stats), times=req.times.copy(), error=req.error))
        return RequestOutput(parent.request_id, parent.prompt_token_ids, outs, parent.prompt_text,
                             parent.children[0].num_cached_tokens)

    def _retire(self, parent: _Parent) -> None:
        self._parents.pop(parent.request_id, None)
        for req in parent.children:
            self._detok.pop(req.request_id, None)
            self._logprobs.pop(req.request_id, None)
            if self.spec_control is not None:
                self.spec_control.forget(req.request_id)

    def _fill_state(self, stats: StepStats, num_scheduled: int) -> None:
        """The queue, KV and draft-probability gauges as the step left them."""
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.kv_cache_usage = self.kv.pool.usage
        stats.num_free_blocks = self.kv.pool.num_free
        stats.num_scheduled_tokens = num_scheduled
        stats.draft_prob_bytes = self._draft_prob_bytes = self.draft_prob_bytes()

    def draft_prob_bytes(self) -> int:
        """Bytes of device memory the stored draft probabilities keep alive: each storage once
        (requests drafted in one step hold views of one batch-wide copy, runner/draft_loop.py)."""
        total, seen = 0, set()
        for req in self.scheduler.requests.values():
            if req.draft_probs is not None:
                storage = req.draft_probs.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
        return total

    def debug_state(self) -> dict:
        """Counters safe to read from another thread (no iteration over live containers)."""
        return {
            "num_free_blocks": self.kv.pool.num_free,
            "num_total_blocks": self.kv.num_blocks,
            "num_unfinished_requests": len(self._parents),
            "num_scheduler_requests": len(self.scheduler.requests),
            "draft_prob_bytes": self._draft_prob_bytes,
            "speculation": None if self.spec_control is None else self.spec_control.snapshot,
        }


def _spec_control(config: EngineConfig, info: EngineInfo, runner,
                  zero_runs_ahead: bool) -> Optional[SpecControl]:
    """The k controller (None without a draft); adaptive mode calibrates the device first.
    ``zero_runs_ahead``: steps at k = 0 run ahead of the host (decode-ahead)."""
    spec = config.speculative
    if info.num_speculative_tokens <= 0:
        return None
    calibration = None
    if spec.speculative_k == "adaptive":
        from specserve.engine.runner.calibration import calibrate

        calibration = calibrate(runner, config.max_num_seqs)
    # strict verification emits the target's own sample whatever was drafted (any draft method)
    k_dependent = spec.rejection_sample_method == "probabilistic"
    return SpecControl(info.num_speculative_tokens, spec.speculative_k, info.max_model_len,
                       k_dependent, calibration, zero_runs_ahead)


def _report_late_compile(kernel: str, seconds: float) -> None:
    log.warning("a Triton kernel variant was first needed after start-up (compiled or read from "
                "Triton's disk cache in %.2fs while the steps behind it waited): %s", seconds, kernel)


def _copy_spec(s: SpecDecodeStats) -> SpecDecodeStats:
    return SpecDecodeStats(s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_pos))
