"""What the engine needs to know about a checkpoint, read from its config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    path: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope_type: str
    config_dtype: str
    eos_token_ids: tuple[int, ...] = ()
    generation_defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _rope_type(raw: dict) -> str:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return params.get("rope_type") or params.get("type") or "default"


GENERATION_CONFIG = "generation_config.json"
# generation_config.json keys applied as request defaults -> the SamplingParams field they set
_SAMPLING_DEFAULT_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                          "min_p": "min_p", "repetition_penalty": "repetition_penalty"}


def read_generation_config(folder: str | Path) -> dict[str, Any]:
    """``folder/generation_config.json`` as a dict ({} when the folder has none)."""
    gen_path = Path(folder) / GENERATION_CONFIG
    return json.loads(gen_path.read_text()) if gen_path.exists() else {}


def generation_defaults(gen: dict[str, Any]) -> dict[str, Any]:
    """The request defaults a generation config sets, under SamplingParams' names.

    Sampling knobs count only when the file samples (``do_sample`` true or absent: with
    ``do_sample: false`` transformers ignores them); ``max_new_tokens`` becomes ``max_tokens``.
    Keys set to null are left out.
    """
    out: dict[str, Any] = {}
    if gen.get("do_sample", True):
        out.update({name: gen[key] for key, name in _SAMPLING_DEFAULT_KEYS.items()
                    if gen.get(key) is not None})
    if gen.get("max_new_tokens") is not None:
        out["max_tokens"] = gen["max_new_tokens"]
    return out


def _eos_ids(path: Path, raw: dict) -> tuple[dict[str, Any], tuple[int, ...]]:
    gen = read_generation_config(path)
    eos = gen.get("eos_token_id", raw.get("eos_token_id"))
    if eos is None:
        ids: tuple[int, ...] = ()
    elif isinstance(eos, list):
        ids = tuple(int(e) for e in eos)
    else:
        ids = (int(eos),)
    return generation_defaults(gen), ids


def read_model_spec(path: str | Path) -> ModelSpec:
    """Parse ``path/config.json``; refuse architectures and RoPE variants we do not implement."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"no config.json in {path}: not a Hugging Face checkpoint directory")
    raw = json.loads(cfg_file.read_text())
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else raw.get("model_type", "?")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    rope_type = _rope_type(raw)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{path}: RoPE scaling {rope_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    heads = raw["num_attention_heads"]
    hidden = raw["hidden_size"]
    gen_defaults, eos = _eos_ids(path, raw)
    is_qwen2 = arch == "Qwen2ForCausalLM"
    is_qwen3 = arch == "Qwen3ForCausalLM"
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelSpec(
        path=str(path),
        architecture=arch,
        vocab_size=raw["vocab_size"],
        hidden_size=hidden,
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=True if is_qwen2 else attention_bias,
        o_bias=False if (is_qwen2 or is_qwen3) else attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=is_qwen3,
        rope_type=rope_type,
        config_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"),
        eos_token_ids=eos,
        generation_defaults=gen_defaults,
    )


def load_hf_config(path: str | Path) -> Optional[Any]:
    """The transformers config object (used for RoPE parameters only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path), local_files_only=True)
