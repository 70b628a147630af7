"""Start-up: resolve paths, pick device / dtype / kernel backend once, load models, size the KV cache."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from specserve.engine.config import DEMO_MODEL, ConfigError, EngineConfig
from specserve.engine.models.loader import load_model
from specserve.engine.models.spec import (GENERATION_CONFIG, ModelSpec, generation_defaults,
                                          read_generation_config, read_model_spec)
from specserve.engine.runner.cuda_graphs import graph_logits_bytes
from specserve.engine.runner.ragged_graphs import ragged_graph_bytes
from specserve.engine.runner.draft_loop import DraftLoop
from specserve.engine.runner.model_runner import KVLayout, ModelRunner
from specserve.engine.runner.settings import SpecSettings
from specserve.engine.types import ParamError, SamplingParams
from specserve.kernels import ops
from specserve.kernels.backend import set_backend, triton_available
from specserve.kernels.precompile import SamplingWarmUp, auto_workers, compile_in_workers

log = logging.getLogger("specserve.engine")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_DEFAULT_KV_BYTES = 1 << 30


@dataclass(frozen=True)
class EngineInfo:
    """What the engine was started with, as callers (server, logs, /v1/models) want to know it."""

    model_path: str
    draft_model_path: Optional[str]
    served_model_name: str
    num_speculative_tokens: int
    rejection_sample_method: str
    draft_sample_method: str
    max_model_len: int
    device: str
    dtype: str
    kernel_backend: str
    num_kv_blocks: int
    block_size: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    # request defaults from --generation-config (SamplingParams names; max_tokens included)
    generation_defaults: Mapping[str, Any] = field(default_factory=dict)
    generation_config_file: Optional[str] = None   # where they came from (None: no defaults)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


@dataclass
class LoadedModels:
    info: EngineInfo
    tokenizer: Any
    runner: ModelRunner


def resolve_model_path(name: str, role: str) -> str:
    """``demo`` -> the embedded pair; otherwise a local checkpoint directory."""
    if name == DEMO_MODEL:
        try:
            from specserve.engine import demo
        except ImportError:
            raise ConfigError("the embedded demo pair is not part of this installation; pass --model DIR")
        path = demo.TARGET_DIR if role == "target" else demo.DRAFT_DIR
        if not (Path(path) / "config.json").exists():
            raise ConfigError(f"the embedded demo {role} is missing at {path}; pass --model DIR")
        return str(path)
    if not Path(name).is_dir():
        raise ConfigError(f"{role} model {name!r} is not a local directory (nothing is downloaded; "
                          "point --model at a checkpoint directory, or use 'demo')")
    return str(Path(name).resolve())


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but no CUDA device is available")
    return dev


def pick_dtype(name: str, spec: ModelSpec, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return _DTYPES.get(spec.config_dtype.replace("torch.", ""), torch.bfloat16)


def pick_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    return name


def load_tokenizer(path: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def check_tokenizers_match(target_tok, draft_tok, draft_path: str) -> None:
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ConfigError(f"the draft model {draft_path} uses a different tokenizer than the target; "
                          "speculative decoding needs the same vocabulary (padding may differ)")


def resolve_generation_defaults(choice: str, model_path: str) -> tuple[dict[str, Any], Optional[str]]:
    """``--generation-config``: auto = the model's generation_config.json, vllm = no defaults,
    anything else = a folder holding a generation_config.json. Returns (defaults, the file)."""
    if choice == "vllm":
        return {}, None
    folder = Path(model_path if choice == "auto" else choice)
    gen_file = folder / GENERATION_CONFIG
    if not gen_file.is_file():
        if choice == "auto":
            return {}, None
        raise ConfigError(f"--generation-config {choice!r}: no {GENERATION_CONFIG} in that folder "
                          "(use 'auto' for the model's own, 'vllm' for none)")
    try:
        defaults = generation_defaults(read_generation_config(folder))
    except (ValueError, AttributeError) as e:
        raise ConfigError(f"{gen_file} is not a JSON object of generation settings: {e}") from None
    _check_generation_defaults(defaults, gen_file)
    return defaults, str(gen_file)


def _check_generation_defaults(defaults: dict[str, Any], gen_file: Path) -> None:
    """Refuse at start-up defaults that would make every request fail."""
    for name in ("top_k", "max_tokens"):
        value = defaults.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{gen_file}: {name} must be an integer, got {value!r}")
    try:
        SamplingParams(**defaults)
    except (ParamError, TypeError) as e:
        raise ConfigError(f"{gen_file}: unusable generation defaults: {e}") from None


def describe_generation_defaults(defaults: Mapping[str, Any], gen_file: Optional[str]) -> str:
    if not defaults:
        source = f"{gen_file} sets none" if gen_file else "--generation-config vllm or no generation_config.json"
        return f"generation defaults: none ({source})"
    values = ", ".join(f"{k}={v}" for k, v in defaults.items())
    return (f"generation defaults from {gen_file}: {values} (a request's own fields win; "
            "--generation-config vllm turns them off)")


def _num_blocks(config: EngineConfig, specs: list[ModelSpec], dtype: torch.dtype,
                device: torch.device, max_model_len: int) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    elem = torch.tensor([], dtype=dtype).element_size()
    per_block = config.block_size * sum(s.kv_bytes_per_token(elem) for s in specs)
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * config.gpu_memory_utilization) - (total - free) - (1 << 30)
        spec_cfg = config.speculative
        stores_q = spec_cfg.enabled and SpecSettings(   # the one rule for keeping q
            spec_cfg.num_speculative_tokens, max_model_len, spec_cfg.rejection_sample_method,
            spec_cfg.draft_sample_method).store_probs
        if stores_q:   # the draft loop's q buffer
            budget -= DraftLoop.probs_bytes(spec_cfg.num_speculative_tokens, config.max_num_seqs,
                                            specs[0].vocab_size)
        if not config.enforce_eager:   # the CUDA graphs' logits (captured after the cache)
            k_max = spec_cfg.num_speculative_tokens if spec_cfg.enabled else 0
            budget -= graph_logits_bytes(k_max, config.max_num_seqs, specs[0].vocab_size, elem)
            budget -= sum(ragged_graph_bytes(s, config.ragged_graph_tokens, elem) for s in specs)
    else:
        needed = config.max_num_seqs * (max_model_len + config.block_size) * per_block // config.block_size
        budget = min(_CPU_DEFAULT_KV_BYTES, needed)
    blocks = budget // per_block
    if blocks < 1:
        raise ConfigError(f"no memory left for the KV cache (budget {budget} bytes, one block needs "
                          f"{per_block}); lower --max-model-len or raise --kv-cache-memory / "
                          "--gpu-memory-utilization")
    return int(blocks)


def fit_max_model_len(config: EngineConfig, blocks: int, max_len: int, num_spec: int) -> int:
    """max_model_len checked against a KV cache of ``blocks`` (``config.kv_shortfall`` decides).

    One request of max_model_len tokens occupies max_len + num_spec slots at its last step (the
    draft tokens under verification need KV too), so the largest max_model_len the cache can
    hold is ``blocks * block_size - num_spec``.
    """
    capacity = blocks * config.block_size
    largest = capacity - num_spec
    if max_len <= largest or config.kv_shortfall == "allow":
        return max_len
    where = (f"the KV cache holds {capacity} tokens ({blocks} blocks of {config.block_size}) but one "
             f"request of max_model_len {max_len} needs {max_len + num_spec} slots "
             f"(its {num_spec} draft tokens included)")
    if largest < 2:
        raise ConfigError(f"{where}; it cannot hold even a 2-token request: give the cache more room "
                          "(--kv-cache-memory, --gpu-memory-utilization or --num-kv-blocks)")
    if config.kv_shortfall == "lower":
        log.warning("%s: lowering max_model_len from %d to %d (--auto-fit-max-model-len)", where, max_len,
                    largest)
        return largest
    raise ConfigError(f"{where}; the largest max_model_len it can hold is {largest}. Pass --max-model-len "
                      f"{largest} (or --auto-fit-max-model-len), or give the cache more room "
                      "(--kv-cache-memory, --gpu-memory-utilization or --num-kv-blocks)")


def _launch_tp(config: EngineConfig, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
               backend: str, rope_len: int):
    """--tensor-parallel-size > 1: spawn ranks 1..tp-1 (engine/distributed/); else None."""
    tp = config.tensor_parallel_size
    if tp == 1:
        return None
    from specserve.engine.distributed.launch import check_split, launch

    check_split(spec, tp, device)
    log.info("tensor parallel: splitting the target over %d ranks (the draft stays on rank 0)", tp)
    return launch(tp, spec, device, dtype, backend, rope_len, config.load_format, config.seed,
                  config.block_size)


def precompile_sampling(config: EngineConfig, vocab_size: int, num_spec: int, max_len: int,
                        dtype: torch.dtype, device: torch.device, backend: str) -> None:
    """On a cold Triton cache, compile the sampler's kernel variants in worker processes
    (kernels/precompile.py) so that the runner's warm-up reads them from the cache; the server
    calls it before the weights load. The workers make the runner's own warm-up calls
    (``SpecSettings.sampler_warm_up``). CUDA with Triton kernels only, and not under tensor
    parallelism (left out: not measured there). Only a speed-up: anything that goes wrong is
    logged and the runner's warm-up compiles as before."""
    if device.type != "cuda" or backend != "triton" or config.tensor_parallel_size != 1:
        return
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        workers = config.compile_workers
        if workers is None:
            workers = auto_workers(free_bytes=torch.cuda.mem_get_info(index)[0])
        if workers < 1:
            return
        spec_cfg = config.speculative
        settings = SpecSettings(num_spec, max_len, spec_cfg.rejection_sample_method,
                                spec_cfg.draft_sample_method)
        k_max, method, with_probs, store_probs = settings.sampler_warm_up
        job = SamplingWarmUp(vocab_size, config.max_num_seqs, k_max, method, with_probs, store_probs,
                             str(dtype).replace("torch.", ""), f"cuda:{index}")
        compile_in_workers(job, workers)
    except Exception as e:   # noqa: BLE001 - a speed-up must never stop the server starting
        log.warning("sampling kernels: compiling in workers failed (%s: %s); the start-up "
                    "warm-up compiles them instead", type(e).__name__, e)


def load_models(config: EngineConfig) -> LoadedModels:
    device = pick_device(config.device)
    target_path = resolve_model_path(config.model, "target")
    target_spec = read_model_spec(target_path)
    gen_defaults, gen_file = resolve_generation_defaults(config.generation_config, target_path)
    dtype = pick_dtype(config.dtype, target_spec, device)
    backend = pick_backend(config.kernel_backend, device)
    set_backend(backend)
    ops.set_gemv(config.gemv)
    spec_cfg = config.speculative
    draft_path = resolve_model_path(spec_cfg.model, "draft") if spec_cfg.enabled else None
    draft_spec = read_model_spec(draft_path) if draft_path else None
    tokenizer = load_tokenizer(config.tokenizer or target_path)
    if draft_path:
        check_tokenizers_match(tokenizer, load_tokenizer(draft_path), draft_path)
    max_len = config.max_model_len or min(s.max_position_embeddings for s in (target_spec, draft_spec) if s)
    num_spec = spec_cfg.num_speculative_tokens if draft_spec else 0
    if config.max_num_batched_tokens < num_spec + 1:
        raise ConfigError("--max-num-batched-tokens must be at least --num-speculative-tokens + 1")
    rope_len = max_len + num_spec + 1
    precompile_sampling(config, target_spec.vocab_size, num_spec, max_len, dtype, device, backend)
    log.info("loading target %s (%s) on %s in %s, kernels: %s", target_path, target_spec.architecture,
             device, str(dtype).replace("torch.", ""), backend)
    tp = _launch_tp(config, target_spec, device, dtype, backend, rope_len)   # None at TP = 1
    target = load_model(target_spec, device, dtype, rope_len, config.load_format, config.seed,
                        None if tp is None else tp.group)
    draft = None
    if draft_spec:
        log.info("loading draft %s (%s), k=%d, %s rejection sampling, %s drafts", draft_path,
                 draft_spec.architecture, num_spec, spec_cfg.rejection_sample_method,
                 spec_cfg.draft_sample_method)
        draft = load_model(draft_spec, device, dtype, rope_len, config.load_format, config.seed + 1)
    # rank 0 holds its share of the target KV (kv_spec under TP) and the whole draft KV
    specs = [s for s in (getattr(target, "kv_spec", target_spec), draft_spec) if s]
    blocks = _num_blocks(config, specs, dtype, device, max_len)
    max_len = fit_max_model_len(config, blocks, max_len, num_spec)
    if tp is not None:
        tp.start(blocks, max_len if device.type == "cuda" else None)
    settings = SpecSettings(num_spec, max_len, spec_cfg.rejection_sample_method,
                            spec_cfg.draft_sample_method)
    runner = ModelRunner(target, draft, KVLayout(blocks, config.block_size, dtype, device), settings,
                         config.max_num_seqs, config.enforce_eager or backend != "triton" or tp is not None,
                         tp=tp, max_step_tokens=config.max_num_batched_tokens,
                         ragged_graph_tokens=config.ragged_graph_tokens)
    eos = target_spec.eos_token_ids or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    info = EngineInfo(
        model_path=target_path, draft_model_path=draft_path,
        served_model_name=config.served_model_name or config.model,   # vLLM: the path as given
        num_speculative_tokens=num_spec, rejection_sample_method=spec_cfg.rejection_sample_method,
        draft_sample_method=spec_cfg.draft_sample_method, max_model_len=max_len, device=str(device),
        dtype=str(dtype).replace("torch.", ""), kernel_backend=backend, num_kv_blocks=blocks,
        block_size=config.block_size, vocab_size=target_spec.vocab_size, eos_token_ids=eos,
        generation_defaults=gen_defaults, generation_config_file=gen_file)
    log.info("KV cache: %d blocks of %d tokens = %d tokens; max model len %d", blocks,
             config.block_size, info.kv_capacity_tokens, max_len)
    log.info("%s", describe_generation_defaults(gen_defaults, gen_file))
    return LoadedModels(info, tokenizer, runner)
