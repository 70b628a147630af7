"""What the sections of one ``specserve bench`` run share: device, bandwidth, models, engines.

Everything expensive is made on first use and kept: the copy bandwidth is measured once, the
8B-like (or tiny) dummy target and draft are loaded once, and each engine flavour (plain, with
the draft, self-draft) is built once — so sections can run alone (``--sections verify``) or
together without paying twice. ``release_models()`` frees device memory between model groups.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from specserve.bench import shapes
from specserve.bench.engines import ModelCache, execution_mode, free_device_memory
from specserve.bench.timing import Bandwidth, copy_bandwidth
from specserve.bench.options import BenchOptions


class BenchContext:
    def __init__(self, opts: BenchOptions):
        from specserve.engine.setup import pick_device

        self.opts = opts
        self.device = pick_device(opts.device)
        self.dtype = opts.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        if opts.cpu_threads:
            import torch

            torch.set_num_threads(opts.cpu_threads)
        self.out = Path(opts.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(prefix="specserve-bench-")
        self.tmp = Path(self._tmp.name)
        self.t0 = time.perf_counter()
        self._bandwidth: Optional[Bandwidth] = None
        self._dummy: Optional[tuple[str, str]] = None
        self._dummy_cache: Optional[ModelCache] = None
        self._pair_cache: Optional[ModelCache] = None
        self._cores: dict[str, Any] = {}
        self.shared: dict[str, Any] = {}     # numbers one section measures and another uses
        self.mode: Optional[dict] = None

    # ---- progress --------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[bench {time.perf_counter() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    # ---- bandwidth -------------------------------------------------------------------------
    def bandwidth(self) -> Bandwidth:
        if self._bandwidth is None:
            o = self.opts
            self._bandwidth = copy_bandwidth(self.device, o.bandwidth_bytes, o.bandwidth_repeats)
            self.log(f"copy bandwidth {self._bandwidth.bytes_per_s / 1e9:.1f} GB/s "
                     f"({o.bandwidth_bytes >> 20} MiB buffer, {self._bandwidth.method})")
        return self._bandwidth

    # ---- the dummy (8B-like / 0.6B-like, or tiny) pair ---------------------------------------
    def dummy_shapes(self) -> tuple[shapes.ModelShape, shapes.ModelShape]:
        if self.opts.quick:
            return shapes.TINY_TARGET, shapes.TINY_DRAFT
        return shapes.QWEN3_8B_LIKE, shapes.QWEN3_06B_LIKE

    def dummy_dirs(self) -> tuple[str, str]:
        if self._dummy is None:
            t, d = shapes.write_pair(self.tmp / "dummy", *self.dummy_shapes())
            self._dummy = (str(t), str(d))
        return self._dummy

    def roofline_shapes(self) -> tuple[shapes.ModelShape, ...]:
        """The targets the roofline section times (ours and the compiled peer): the dummy target
        first, then a Llama-3-8B-like one (tiny ones with --quick)."""
        return (self.dummy_shapes()[0], shapes.TINY_LLAMA if self.opts.quick else shapes.LLAMA3_8B_LIKE)

    def extra_plain_core(self, shape: shapes.ModelShape) -> tuple[Any, ModelCache, str]:
        """(engine, its model cache, checkpoint dir): a plain engine over a dummy checkpoint of
        ``shape``, built like ``dummy_core("plain")`` but outside the shared caches. The caller
        owns it: drop the engine and call ``cache.release()`` when done."""
        path = shapes.write_checkpoint(self.tmp / "extra" / shape.name, shape)
        o = self.opts
        cache = ModelCache(str(self.device), self.dtype, o.kernel_backend, o.max_model_len,
                           o.enforce_eager, o.seed, o.ragged_graph_tokens)
        mb = self.max_batch()
        t0 = time.perf_counter()
        core = cache.core(str(path), None, 0, self.kv_blocks(mb), "dummy", max_num_seqs=max(mb, 1))
        self.log(f"engine 'plain' on the dummy {shape.name} ready in {time.perf_counter() - t0:.1f}s "
                 f"({execution_mode(core)['description']})")
        return core, cache, str(path)

    def kv_blocks(self, max_batch: int, block_size: int = 16) -> int:
        """Blocks for ``max_batch`` sequences of prompt + output + 2 (k + 1) tokens (explicit: no
        engine sizes its cache from free memory, so several can coexist)."""
        o = self.opts
        tokens = max(o.prompt_len + o.output_len, o.verify_context + 9) + 2 * (o.k + 1)
        return max_batch * (math.ceil(tokens / block_size) + 1) + 8

    def max_batch(self) -> int:
        return max(self.opts.batch_sizes)

    def dummy_cache(self) -> ModelCache:
        if self._dummy_cache is None:
            o = self.opts
            self._dummy_cache = ModelCache(str(self.device), self.dtype, o.kernel_backend,
                                           o.max_model_len, o.enforce_eager, o.seed,
                                           o.ragged_graph_tokens)
        return self._dummy_cache

    def dummy_core(self, flavour: str):
        """``plain`` (target only), ``pair`` (target + 0.6B-like draft), ``self`` (target as draft)."""
        key = "dummy-" + flavour
        if key not in self._cores:
            target, draft = self.dummy_dirs()
            cache = self.dummy_cache()
            t0 = time.perf_counter()
            draft_dir = {"plain": None, "pair": draft, "self": target}[flavour]
            mb = self.max_batch()
            self._cores[key] = cache.core(target, draft_dir, self.opts.k if draft_dir else 0,
                                          self.kv_blocks(mb), "dummy", max_num_seqs=max(mb, 1))
            self.mode = self.mode or execution_mode(self._cores[key])
            loads = ", ".join(f"{Path(p).name} loaded in {s:.1f}s" for p, s in cache.load_seconds.items())
            self.log(f"engine '{flavour}' on the dummy {Path(target).name} ready in "
                     f"{time.perf_counter() - t0:.1f}s ({execution_mode(self._cores[key])['description']}; "
                     f"{loads})")
        return self._cores[key]

    # ---- the real pair (demo, or --pair-target/--pair-draft) ---------------------------------
    def pair_dirs(self) -> tuple[Optional[tuple[str, str]], str]:
        """((target, draft), label) or (None, why not)."""
        o = self.opts
        if o.pair_target:
            return (str(Path(o.pair_target).resolve()), str(Path(o.pair_draft).resolve())), "given pair"
        try:
            from specserve.engine import demo
        except ImportError:
            return None, "the embedded demo pair is not part of this installation"
        if not (Path(demo.TARGET_DIR) / "config.json").exists():
            return None, f"the demo pair has no weights ({demo.TARGET_DIR}/config.json missing)"
        return (str(demo.TARGET_DIR), str(demo.DRAFT_DIR)), "demo pair"

    def pair_core(self, flavour: str):
        """``plain`` or ``pair`` engine over the real pair (safetensors weights)."""
        key = "pair-" + flavour
        if key not in self._cores:
            dirs, why = self.pair_dirs()
            if dirs is None:
                raise RuntimeError(why)
            if self._pair_cache is None:
                from specserve.engine.models.spec import read_model_spec

                limit = min(read_model_spec(p).max_position_embeddings for p in dirs)
                o = self.opts
                self._pair_cache = ModelCache(str(self.device), self.dtype, o.kernel_backend,
                                              min(o.max_model_len, limit), o.enforce_eager, o.seed,
                                              o.ragged_graph_tokens)
            mb = self.max_batch()
            self._cores[key] = self._pair_cache.core(dirs[0], dirs[1] if flavour == "pair" else None,
                                                     self.opts.k if flavour == "pair" else 0,
                                                     self.kv_blocks(mb), "auto", max_num_seqs=max(mb, 1))
        return self._cores[key]

    # ---- memory --------------------------------------------------------------------------------
    def release_models(self) -> None:
        """Drop every engine and model (the next section group starts with free device memory)."""
        self._cores.clear()
        for cache in (self._dummy_cache, self._pair_cache):
            if cache is not None:
                cache.release()
        self._dummy_cache = self._pair_cache = None
        free_device_memory(self.device)

    def close(self) -> None:
        self.release_models()
        self._tmp.cleanup()
