"""Load each model once, build EngineCores around them, time runner forwards.

Loading the 8B-like dummy target takes a while (random weights for 8 billion parameters), and
several engines need it: plain decoding, the target with a draft, the target as its own draft.
:class:`ModelCache` loads every checkpoint directory once and assembles engines the way
``engine.setup.load_models`` does — same runner class, same device / dtype / kernel-backend
choice — but around the already-loaded modules. A draft directory equal to the target directory
gives the *same* module (shared weights, separate KV cache): the self-draft upper-bound check.
"""

from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from specserve.bench.timing import median, synchronize, time_calls
from specserve.engine.config import EngineConfig, SpeculativeConfig
from specserve.engine.core import EngineCore
from specserve.engine.heap import settle_after_startup, unfreeze
from specserve.engine.models.llama import LlamaFamilyModel
from specserve.engine.models.loader import load_model
from specserve.engine.models.spec import read_model_spec
from specserve.engine.runner.inputs import ForwardItem
from specserve.engine.runner.model_runner import KVLayout, ModelRunner
from specserve.engine.runner.settings import SpecSettings
from specserve.engine.setup import (EngineInfo, LoadedModels, load_tokenizer, pick_backend, pick_device,
                                    pick_dtype, precompile_sampling)
from specserve.engine.types import SamplingParams, SpecDecodeStats, StepStats
from specserve.kernels.backend import set_backend

MAX_K = 16   # the largest k any engine of a cache may use (RoPE tables are sized for it)


class ModelCache:
    """Models loaded once per run, keyed by checkpoint directory."""

    def __init__(self, device: str, dtype: str, kernel_backend: str, max_model_len: int,
                 enforce_eager: bool, seed: int = 0, ragged_graph_tokens: int = 1024):
        self.device = pick_device(device)
        self.dtype_name = dtype
        self.kernel_backend = kernel_backend
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.ragged_graph_tokens = ragged_graph_tokens
        self.seed = seed
        self._models: dict[str, LlamaFamilyModel] = {}
        self._tokenizers: dict[str, Any] = {}
        self.load_seconds: dict[str, float] = {}

    def dtype_for(self, path: str) -> torch.dtype:
        return pick_dtype(self.dtype_name, read_model_spec(path), self.device)

    def model(self, path: str, load_format: str, seed: int) -> LlamaFamilyModel:
        key = str(Path(path).resolve())
        if key not in self._models:
            spec = read_model_spec(key)
            t0 = time.perf_counter()
            self._models[key] = load_model(spec, self.device, self.dtype_for(key),
                                           self.max_model_len + MAX_K + 1, load_format, seed)
            synchronize(self.device)
            self.load_seconds[key] = time.perf_counter() - t0
        return self._models[key]

    def tokenizer(self, path: str) -> Any:
        key = str(Path(path).resolve())
        if key not in self._tokenizers:
            self._tokenizers[key] = load_tokenizer(key)
        return self._tokenizers[key]

    def core(self, target_dir: str, draft_dir: Optional[str], k: int, num_kv_blocks: int,
             load_format: str, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
             block_size: int = 16, speculative_k: str = "fixed") -> EngineCore:
        """An EngineCore over cached models; ``draft_dir=None`` or ``k=0``: no speculation.
        ``speculative_k``: ``fixed`` (always k: what the e2e section measures) or ``adaptive``."""
        spec_cfg = (SpeculativeConfig(draft_dir, k, speculative_k=speculative_k) if draft_dir and k
                    else SpeculativeConfig())
        config = EngineConfig(model=target_dir, speculative=spec_cfg, dtype=self.dtype_name,
                              load_format=load_format, device=str(self.device),
                              kernel_backend=self.kernel_backend, seed=self.seed,
                              block_size=block_size, num_kv_blocks=num_kv_blocks,
                              enable_prefix_caching=False, max_model_len=self.max_model_len,
                              max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              enforce_eager=self.enforce_eager,
                              ragged_graph_tokens=self.ragged_graph_tokens)
        backend = pick_backend(self.kernel_backend, self.device)
        set_backend(backend)
        target = self.model(target_dir, load_format, self.seed)
        draft = self.model(draft_dir, load_format, self.seed + 1) if spec_cfg.enabled else None
        dtype = self.dtype_for(target_dir)
        settings = SpecSettings(k if draft is not None else 0, self.max_model_len,
                                spec_cfg.rejection_sample_method, spec_cfg.draft_sample_method)
        precompile_sampling(config, target.spec.vocab_size, settings.num_speculative_tokens,
                            self.max_model_len, dtype, self.device, backend)
        runner = ModelRunner(target, draft, KVLayout(num_kv_blocks, block_size, dtype, self.device),
                             settings, max_num_seqs, self.enforce_eager,
                             max_step_tokens=max_num_batched_tokens,
                             ragged_graph_tokens=self.ragged_graph_tokens)
        tspec = target.spec
        tok = self.tokenizer(target_dir)
        eos = tspec.eos_token_ids or ((tok.eos_token_id,) if tok.eos_token_id is not None else ())
        info = EngineInfo(
            model_path=target_dir, draft_model_path=draft_dir if draft is not None else None,
            served_model_name=Path(target_dir).name, num_speculative_tokens=runner.num_speculative_tokens,
            rejection_sample_method=spec_cfg.rejection_sample_method,
            draft_sample_method=spec_cfg.draft_sample_method, max_model_len=self.max_model_len,
            device=str(self.device), dtype=str(dtype).replace("torch.", ""), kernel_backend=backend,
            num_kv_blocks=num_kv_blocks, block_size=block_size, vocab_size=tspec.vocab_size,
            eos_token_ids=eos)
        core = EngineCore(config, LoadedModels(info, tok, runner))
        settle_after_startup()   # as the server does: no full GC passes inside timed steps
        return core

    def release(self) -> None:
        """Drop every model and free device memory (before the next, larger thing needs it)."""
        self._models.clear()
        free_device_memory(self.device)


def free_device_memory(device: torch.device) -> None:
    unfreeze()   # engines frozen by ``ModelCache.core`` become collectable again
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def execution_mode(core: EngineCore) -> dict:
    """How the runner executes steps: CUDA graphs or eager, and why (reported with every result)."""
    graphs = getattr(core.runner, "graphs", None) or {}
    captured = sorted(f"{which} q={q} batch<={max(g.buckets)}" for (which, q), g in graphs.items())
    ragged = getattr(core.runner, "ragged", None) or {}
    captured += sorted(f"{which} ragged tokens<={g.max_tokens}" for which, g in ragged.items())
    if core.info.device.startswith("cpu"):
        mode, why = "eager", "CPU"
    elif core.config.enforce_eager:
        mode, why = "eager", "--enforce-eager"
    elif captured:
        prefill = (f"prefill/mixed/catch-up up to {max(g.max_tokens for g in ragged.values())} tokens "
                   "ragged graphs, larger eager" if ragged else "prefill eager")
        mode, why = "cuda-graphs", f"uniform decode/verify/draft batches; {prefill}"
    else:
        mode, why = "eager", "this runner captured no CUDA graphs"
    return {"mode": mode, "description": f"{mode} ({why})", "captured": captured}


def uses_graph(core: EngineCore, which: str, items: list[ForwardItem]) -> bool:
    """Whether ``runner._forward(which, items)`` replays a CUDA graph rather than running eagerly."""
    graphs = getattr(core.runner, "graphs", None) or {}
    g = graphs.get((which, len(items[0].token_ids))) if items else None
    return bool(g is not None and g.fits(items))


def weight_bytes(model: LlamaFamilyModel) -> dict:
    """Parameter bytes, and the bytes one batch-1 decode step must read.

    A step reads every weight once except the input embedding table, of which it gathers one row
    (when the LM head is tied to it, the LM head reads the whole table anyway).
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.embed_tokens.weight
    emb_bytes = emb.numel() * emb.element_size()
    per_step = total if model.spec.tie_word_embeddings else total - emb_bytes + emb[0].numel() * emb.element_size()
    return {"parameter_bytes": total, "bytes_per_decode_step": per_step,
            "num_parameters": sum(p.numel() for p in model.parameters())}


# ---- forward timing ------------------------------------------------------------------------
def forward_items(batch: int, num_tokens: int, context: int, block_size: int, num_blocks: int,
                  vocab_size: int) -> list[ForwardItem]:
    """``batch`` requests, each feeding ``num_tokens`` tokens after ``context`` earlier positions.

    Every request gets blocks of its own; every fed position asks for logits (as verification does).
    """
    per = math.ceil((context + num_tokens) / block_size)
    if batch * per > num_blocks:
        raise ValueError(f"{batch} x {per} blocks needed for timing, the KV cache has {num_blocks}")
    return [ForwardItem([(7 + 13 * b + j) % vocab_size for j in range(num_tokens)], context,
                        list(range(b * per, (b + 1) * per)), num_tokens) for b in range(batch)]


@dataclass(frozen=True)
class ForwardTiming:
    seconds: float        # median of the timed calls
    graph: bool           # a CUDA graph was replayed (else eager)


def time_forward(core: EngineCore, which: str, batch: int, num_tokens: int, context: int,
                 warmup: int, repeats: int, eager: bool = False) -> ForwardTiming:
    """Median seconds of one ``runner._forward`` (target or draft) including the LM head.

    This is the path a step takes: a captured CUDA graph when the batch is uniform and fits a
    bucket, else eager. Each call builds its inputs on the host, as a real step does.
    ``eager=True`` hides the runner's graphs for the duration (restored afterwards) to time
    the eager path of the same forward.
    """
    runner = core.runner
    if which == "draft" and runner.draft is None:
        raise ValueError("this engine has no draft model")
    if which not in ("target", "draft"):
        raise ValueError(which)
    items = forward_items(batch, num_tokens, context, runner.block_size, core.info.num_kv_blocks,
                          runner.vocab_size)

    def fn():
        return runner._forward(which, items) if which == "target" else runner._draft_forward(items)

    graphs = getattr(runner, "graphs", None)
    if eager and graphs:
        runner.graphs = {}
    try:
        graphed = uses_graph(core, which, items)
        with torch.inference_mode():
            secs = median(time_calls(fn, runner.device, warmup, repeats))
    finally:
        if eager and graphs:
            runner.graphs = graphs
    return ForwardTiming(secs, graphed)


# ---- generation through the engine ---------------------------------------------------------
@dataclass
class GenerationRun:
    """One batch generated to a fixed length through EngineCore.step()."""

    batch: int
    output_len: int
    total_tokens: int = 0
    total_seconds: float = 0.0
    decode_tokens: int = 0          # tokens emitted after every request had its first token
    decode_seconds: float = 0.0
    num_steps: int = 0
    decode_steps: int = 0
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    outputs: dict[str, list[int]] = field(default_factory=dict)

    @property
    def decode_tok_per_s(self) -> Optional[float]:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def total_tok_per_s(self) -> Optional[float]:
        return self.total_tokens / self.total_seconds if self.total_seconds > 0 else None

    def as_dict(self) -> dict:
        return {"batch": self.batch, "output_len": self.output_len, "total_tokens": self.total_tokens,
                "total_seconds": self.total_seconds, "decode_tokens": self.decode_tokens,
                "decode_seconds": self.decode_seconds, "num_steps": self.num_steps,
                "decode_steps": self.decode_steps, "decode_tok_per_s": self.decode_tok_per_s,
                "total_tok_per_s": self.total_tok_per_s, "spec_decode": self.spec.as_dict()}


def random_prompts(batch: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Token-id prompts (ids in [10, min(V, 30000)): ordinary tokens, no special ids)."""
    rng = random.Random(seed)
    hi = min(vocab_size - 2, 30000)
    return [[rng.randrange(10, hi) for _ in range(length)] for _ in range(batch)]


def run_generation(core: EngineCore, prompts: list[list[int]], output_len: int, tag: str,
                   max_steps: int = 100000, temperature: float = 0.0,
                   on_decode_step: Optional[Callable[[StepStats], None]] = None) -> GenerationRun:
    """``ignore_eos``, exactly ``output_len`` tokens per prompt (greedy unless ``temperature``,
    unseeded); step until all finish. ``on_decode_step`` sees the stats of every decode-phase
    step (after every request has its first token).

    Outputs are final-only, as ``LLM.generate`` asks (vLLM's offline throughput path): no
    cumulative output is built for every request after every step, host work that at batch 256
    cost the plain engine's steps up to a third of their time on an H200 (README, "final-only
    outputs"). Until 2026-12-07 the bench built them every step."""
    params = SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        core.add_request(rid, prompt, params, final_only=True)
    run = GenerationRun(len(prompts), output_len)
    no_token_yet = set(ids)   # the decode phase starts once every request has its first token
    held = core.scheduler.requests   # running and waiting requests, by id
    t_start = time.perf_counter()
    t_decode: Optional[float] = None
    tokens_at_decode = 0
    for _ in range(max_steps):
        if not core.has_unfinished():
            break
        outs, stats = core.step()
        run.num_steps += 1
        run.total_tokens += stats.num_generation_tokens
        run.spec.merge(stats.spec_decode)
        if t_decode is not None:
            run.decode_steps += 1
            if on_decode_step is not None:
                on_decode_step(stats)
        for out in outs:
            if out.finished:
                run.outputs[out.request_id] = list(out.outputs[0].token_ids)
        if t_decode is None:
            # a request the scheduler no longer holds has finished (with its tokens)
            no_token_yet = {rid for rid in no_token_yet
                            if rid in held and not held[rid].num_output_tokens}
            if not no_token_yet:
                t_decode, tokens_at_decode = time.perf_counter(), run.total_tokens
    else:
        raise RuntimeError(f"generation did not finish in {max_steps} steps: {core.debug_state()}")
    t_end = time.perf_counter()
    run.total_seconds = t_end - t_start
    if t_decode is not None:
        run.decode_seconds = t_end - t_decode
        run.decode_tokens = run.total_tokens - tokens_at_decode
    run.outputs = {rid[len(tag) + 1:]: toks for rid, toks in run.outputs.items()}
    return run
