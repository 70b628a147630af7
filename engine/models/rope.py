"""Rotary-embedding tables (cos/sin per position), with the checkpoint's RoPE scaling."""

from __future__ import annotations

import torch

from specserve.engine.models.spec import ModelSpec, load_hf_config


def _default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rope_tables(spec: ModelSpec, max_positions: int) -> tuple[torch.Tensor, float]:
    """Returns (cos_sin_cache [max_positions, head_dim] fp32, attention_scaling).

    Scaled variants (linear, llama3, yarn) take their frequencies from transformers' own RoPE
    initialisers so that the parameters mean exactly what the checkpoint's authors meant.
    """
    config = load_hf_config(spec.path)
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    if spec.rope_type == "default":
        inv_freq, scaling = _default_inv_freq(theta, spec.head_dim), 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if not getattr(config, "head_dim", None):
            config.head_dim = spec.head_dim
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[spec.rope_type](config, torch.device("cpu"))
    t = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq.float())                      # [max_pos, D/2]
    cache = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)  # [max_pos, D]
    return cache, float(scaling)
