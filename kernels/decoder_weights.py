"""What a fused decoder-layer op needs from one Llama-family layer (kernels import no engine code,
so the model hands its tensors over in this form)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class DecoderWeights:
    """One decoder layer: RMSNorm -> attention -> RMSNorm -> SiLU MLP (nn.Linear layouts)."""

    input_norm: torch.Tensor             # [H]
    qkv: torch.Tensor                    # [(Hq + 2 Hk) D, H]
    qkv_bias: Optional[torch.Tensor]     # [(Hq + 2 Hk) D] (Qwen2)
    q_norm: Optional[torch.Tensor]       # [D] (Qwen3)
    k_norm: Optional[torch.Tensor]       # [D]
    o: torch.Tensor                      # [H, Hq D]
    o_bias: Optional[torch.Tensor]
    post_norm: torch.Tensor              # [H]
    gate_up: torch.Tensor                # [2 I, H]
    gate_up_bias: Optional[torch.Tensor]
    down: torch.Tensor                   # [H, I]
    down_bias: Optional[torch.Tensor]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    scale: float
    barrier: Optional[torch.Tensor]      # int32 [2] on the device, zeros: the grid barrier's state
