"""Engine configuration: small frozen dataclasses validated once, at construction.

The CLI (server/cli.py) is the only place that reads argv or environment variables and turns
them into an :class:`EngineConfig`; the engine itself never looks at the environment.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal, Optional

DType = Literal["auto", "float32", "bfloat16", "float16"]
LoadFormat = Literal["auto", "safetensors", "dummy"]
RejectionMethod = Literal["probabilistic", "strict"]
DraftSampleMethod = Literal["sample", "greedy"]
KVShortfall = Literal["allow", "refuse", "lower"]
SpeculativeK = Literal["adaptive", "fixed"]

DEMO_MODEL = "demo"  # the name of the embedded demo pair


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which option and why."""


_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
               "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_size(text: str | int | None) -> Optional[int]:
    """'2GiB', '512MB', '1e9' or an int -> bytes."""
    if text is None or isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"cannot read {text!r} as a size (examples: 2GiB, 512MB, 1000000)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class SpeculativeConfig:
    """The draft model and how its proposals are verified."""

    model: Optional[str] = None
    num_speculative_tokens: int = 0
    rejection_sample_method: RejectionMethod = "probabilistic"
    draft_sample_method: DraftSampleMethod = "sample"
    # adaptive: every step the engine picks k in 0..num_speculative_tokens (engine/spec_control.py);
    # fixed: always num_speculative_tokens (less near max_tokens)
    speculative_k: SpeculativeK = "adaptive"

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 0 or self.num_speculative_tokens > 16:
            raise ConfigError("--num-speculative-tokens must be between 0 and 16")
        if self.rejection_sample_method not in ("probabilistic", "strict"):
            raise ConfigError("--rejection-sample-method must be 'probabilistic' or 'strict'")
        if self.draft_sample_method not in ("sample", "greedy"):
            raise ConfigError("--draft-sample-method must be 'sample' or 'greedy'")
        if self.speculative_k not in ("adaptive", "fixed"):
            raise ConfigError("--speculative-k must be 'adaptive' or 'fixed'")

    @property
    def enabled(self) -> bool:
        return self.model is not None and self.num_speculative_tokens > 0

    @staticmethod
    def from_json(text: str) -> "SpeculativeConfig":
        """Accept vLLM's ``--speculative-config`` JSON (method ``draft_model``)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--speculative-config is not valid JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError("--speculative-config must be a JSON object")
        method = raw.pop("method", "draft_model")
        draft_tp = raw.pop("tensor_parallel_size", 1)   # vLLM's key: the draft's own TP size
        if draft_tp != 1 or isinstance(draft_tp, bool):
            raise ConfigError(f"--speculative-config tensor_parallel_size {draft_tp!r} is not supported: "
                              "the draft runs unsplit on rank 0 (only 1 is accepted); split the "
                              "target with --tensor-parallel-size")
        if method != "draft_model":
            raise ConfigError(f"--speculative-config method {method!r} is not supported; use 'draft_model'")
        known = {"model", "num_speculative_tokens", "rejection_sample_method", "draft_sample_method",
                 "speculative_k"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"--speculative-config has unknown keys {unknown}; known: {sorted(known)}")
        if "model" not in raw:
            raise ConfigError("--speculative-config needs 'model' (the draft checkpoint directory)")
        raw.setdefault("num_speculative_tokens", 4)
        return SpeculativeConfig(**raw)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start. Defaults suit a laptop CPU with the demo pair."""

    model: str = DEMO_MODEL
    tokenizer: Optional[str] = None
    served_model_name: Optional[str] = None
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    dtype: DType = "auto"
    load_format: LoadFormat = "auto"
    device: str = "auto"                      # auto | cpu | cuda | cuda:N
    kernel_backend: str = "auto"              # auto | torch | triton
    gemv: bool = True                         # Triton GEMV for linears of 1-8 rows (triton backend)
    seed: int = 0
    # KV cache
    block_size: int = 16
    num_kv_blocks: Optional[int] = None       # forces the pool size (tests use it to force preemption)
    kv_cache_memory: Optional[int] = None     # bytes for target + draft KV
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True
    # scheduling
    max_model_len: Optional[int] = None       # default: the model's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_waiting_requests: int = 1024
    enforce_eager: bool = False
    # prefill chunks, mixed steps and catch-ups of up to this many tokens replay CUDA graphs
    # captured per token bucket (engine/runner/ragged_graphs.py); 0 runs them eagerly
    ragged_graph_tokens: int = 1024
    # processes that compile the sampler's Triton kernel variants before the weights load, on a
    # cold Triton cache (kernels/precompile.py); None: one per spare core, at most 8; 0: none
    compile_workers: Optional[int] = None
    # queue each plain decode step on the device before the previous one's tokens are read
    # (engine/decode_ahead.py), and any other step once the previous one's tokens are committed,
    # before their text and outputs (EngineCore._queue_next); exact, so on by default
    async_scheduling: bool = True
    # ranks the target is split over (one process each; rank 0 runs the engine and the draft)
    tensor_parallel_size: int = 1
    # a KV cache too small for one max_model_len request: "allow" (requests that do not fit are
    # refused one by one), "refuse" to start, or "lower" max_model_len to what fits (with a warning)
    kv_shortfall: KVShortfall = "allow"
    # request defaults: "auto" = the model's generation_config.json, "vllm" = none, else a folder
    generation_config: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ConfigError("--block-size must be a power of two between 1 and 128")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError("--num-kv-blocks must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
        if self.max_num_seqs < 1:
            raise ConfigError("--max-num-seqs must be positive")
        if self.max_num_batched_tokens < 1:
            raise ConfigError("--max-num-batched-tokens must be positive")
        if self.ragged_graph_tokens < 0:
            raise ConfigError("--ragged-graph-tokens must be >= 0 (0 turns the ragged graphs off)")
        if self.compile_workers is not None and self.compile_workers < 0:
            raise ConfigError("--compile-workers must be >= 0 (0 compiles in the server process)")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError("--max-model-len must be at least 2")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError("--dtype must be auto, float32, bfloat16 or float16")
        if self.load_format not in ("auto", "safetensors", "dummy"):
            raise ConfigError("--load-format must be auto, safetensors or dummy")
        if self.kernel_backend not in ("auto", "torch", "triton"):
            raise ConfigError("--kernel-backend must be auto, torch or triton")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) \
                or self.tensor_parallel_size < 1:
            raise ConfigError("--tensor-parallel-size must be a positive integer")
        if self.max_waiting_requests < 1:
            raise ConfigError("--max-waiting-requests must be positive")
        if self.kv_shortfall not in ("allow", "refuse", "lower"):
            raise ConfigError("kv_shortfall must be 'allow', 'refuse' or 'lower'")
        if not self.generation_config:
            raise ConfigError("--generation-config must be 'auto', 'vllm' or a folder")

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative.num_speculative_tokens if self.speculative.enabled else 0
