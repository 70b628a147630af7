"""Build a model from a checkpoint directory: safetensors weights (sharded or not) or dummy ones.

Each checkpoint tensor is routed to one parameter of ours (fused q/k/v and gate/up projections
take their slice); anything left unloaded is an error that names the missing weights.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Optional

import torch

from specserve.engine.models.llama import LlamaFamilyModel
from specserve.engine.models.rope import rope_tables
from specserve.engine.models.spec import ModelSpec

log = logging.getLogger("specserve.loader")

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_SHARDED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2), "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_PLAIN = {"self_attn.o_proj": "self_attn.o_proj", "mlp.down_proj": "mlp.down_proj"}
_NORMS = {"input_layernorm.weight": "input_layernorm",
          "post_attention_layernorm.weight": "post_attention_layernorm",
          "self_attn.q_norm.weight": "self_attn.q_norm", "self_attn.k_norm.weight": "self_attn.k_norm"}


def _route(name: str) -> Optional[tuple[str, Optional[int]]]:
    """Checkpoint tensor name -> (our parameter name, shard index or None); None = ignore."""
    if name == "model.embed_tokens.weight":
        return "embed_tokens.weight", None
    if name == "model.norm.weight":
        return "norm", None
    if name == "lm_head.weight":
        return "lm_head", None
    m = _LAYER.match(name)
    if not m:
        return None
    layer, rest = m.group(1), m.group(2)
    if rest in _NORMS:
        return f"layers.{layer}.{_NORMS[rest]}", None
    if "rotary_emb" in rest:
        return None
    module, _, kind = rest.rpartition(".")
    if module in _SHARDED:
        target, shard = _SHARDED[module]
        return f"layers.{layer}.{target}.{kind}", shard
    if module in _PLAIN:
        return f"layers.{layer}.{_PLAIN[module]}.{kind}", None
    return None


def _shard_bounds(spec: ModelSpec, param: str, shard: int) -> tuple[int, int]:
    if "qkv_proj" in param:
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        return [(0, q), (q, q + kv), (q + kv, q + 2 * kv)][shard]
    inter = spec.intermediate_size
    return [(0, inter), (inter, 2 * inter)][shard]


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path} (use --load-format dummy for "
                                "random weights)")
    return files


def _load_weights(model: LlamaFamilyModel, spec: ModelSpec) -> None:
    from safetensors import safe_open

    params = dict(model.named_parameters())
    expected = {(n, s) for n in params for s in _expected_shards(spec, n)}
    loaded: set[tuple[str, Optional[int]]] = set()
    files = _safetensors_files(Path(spec.path))
    for i, file in enumerate(files):
        t0 = time.monotonic()
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                route = _route(name)
                if route is None or route[0] not in params:
                    continue
                param_name, shard = route
                param = params[param_name]
                tensor = f.get_tensor(name)
                loader = getattr(param, "weight_loader", None)   # tensor-parallel shards
                if loader is not None:
                    loader(param, tensor, shard)
                    loaded.add((param_name, shard))
                    continue
                dst = param.data if shard is None else param.data[slice(*_shard_bounds(spec, param_name, shard))]
                if dst.shape != tensor.shape:
                    raise ValueError(f"{file.name}:{name} has shape {tuple(tensor.shape)}, expected "
                                     f"{tuple(dst.shape)} for {param_name}")
                dst.copy_(tensor.to(dst.dtype))
                loaded.add((param_name, shard))
        log.info("loaded weights %d/%d (%s) in %.1fs", i + 1, len(files), file.name, time.monotonic() - t0)
    missing = sorted(n if s is None else f"{n}[shard {s}]" for n, s in expected - loaded)
    if missing:
        raise ValueError(f"{spec.path}: checkpoint is missing {len(missing)} weights, e.g. {missing[:5]}")


def _expected_shards(spec: ModelSpec, name: str) -> list[Optional[int]]:
    if "qkv_proj" in name:
        return [0, 1, 2]
    if "gate_up_proj" in name:
        return [0, 1]
    return [None]


@torch.no_grad()
def _dummy_weights(model: LlamaFamilyModel, seed: int) -> None:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if param.dim() == 1 and ("norm" in name or "layernorm" in name):
            param.fill_(1.0)
        else:  # drawn on the model's device: an 8B model fills in seconds, not minutes
            param.normal_(0.0, 0.02, generator=gen)


@torch.no_grad()
def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype, max_positions: int,
               load_format: str = "auto", seed: int = 0, group=None) -> LlamaFamilyModel:
    """Instantiate ``spec`` on ``device`` in ``dtype`` and fill its weights.

    ``group`` (a TPGroup of more than one rank): build and load only this rank's shard."""
    t0 = time.monotonic()
    cos_sin, _ = rope_tables(spec, max_positions)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            if group is None:
                model = LlamaFamilyModel(spec, cos_sin.to(device))
            else:
                from specserve.engine.models.parallel_llama import ParallelLlamaModel

                model = ParallelLlamaModel(spec, cos_sin.to(device), group)
    finally:
        torch.set_default_dtype(old)
    model.cos_sin_cache = cos_sin.to(device=device, dtype=torch.float32)
    if load_format == "dummy":
        _dummy_weights(model, seed)
    else:
        _load_weights(model, spec)
    model.eval()
    log.info("%s: %s, %.1fM parameters, %s on %s, ready in %.1fs", Path(spec.path).name,
             spec.architecture, spec.num_params / 1e6, str(dtype).replace("torch.", ""), device,
             time.monotonic() - t0)
    return model
