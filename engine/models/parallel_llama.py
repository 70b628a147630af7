"""The Llama family split over tensor-parallel ranks (Megatron layout).

Per decoder layer, two all-reduces: after o_proj and after down_proj (row-parallel); q/k/v and
gate/up are column-parallel, so attention runs on this rank's heads and the MLP on its slice of
the intermediate features. The embedding table and the LM head are split by vocabulary rows.

The forward code is the single-GPU model's own (:class:`Attention`, :class:`MLP`,
:class:`DecoderLayer` and :class:`LlamaFamilyModel` methods): only the shapes and the layers
differ, so TP = 1 and TP > 1 cannot drift apart.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch import nn

from specserve.engine.distributed.group import TPGroup
from specserve.engine.models.llama import Attention, DecoderLayer, LlamaFamilyModel, MLP
from specserve.engine.models.parallel_layers import (ColumnParallelLinear, Part, RowParallelLinear,
                                                     VocabParallelEmbedding, head_split)
from specserve.engine.models.spec import ModelSpec


class ParallelAttention(nn.Module):
    forward = Attention.forward

    def __init__(self, spec: ModelSpec, group: TPGroup):
        super().__init__()
        d = spec.head_dim
        hq, q0, hkv, kv0 = head_split(spec.num_heads, spec.num_kv_heads, group)
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.q_size, self.kv_size = hq * d, hkv * d
        # rows of the checkpoint's q_proj, k_proj, v_proj -> their place in the local packed weight
        parts = [Part(q0 * d, hq * d, 0), Part(kv0 * d, hkv * d, hq * d),
                 Part(kv0 * d, hkv * d, (hq + hkv) * d)]
        self.qkv_proj = ColumnParallelLinear(spec.hidden_size, parts, spec.qkv_bias)
        self.o_proj = RowParallelLinear(spec.num_heads * d, spec.hidden_size, spec.o_bias, group)
        self.eps = spec.rms_norm_eps
        if spec.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(d))
            self.k_norm = nn.Parameter(torch.ones(d))
        else:
            self.q_norm = self.k_norm = None
        self.scale = d ** -0.5


class ParallelMLP(nn.Module):
    forward = MLP.forward

    def __init__(self, spec: ModelSpec, group: TPGroup):
        super().__init__()
        inter = spec.intermediate_size
        if inter % group.world_size:
            raise ValueError(f"intermediate size {inter} does not split over {group.world_size} ranks")
        n = inter // group.world_size
        lo = group.rank * n
        self.gate_up_proj = ColumnParallelLinear(spec.hidden_size, [Part(lo, n, 0), Part(lo, n, n)],
                                                 spec.mlp_bias)
        self.down_proj = RowParallelLinear(inter, spec.hidden_size, spec.mlp_bias, group)


class ParallelDecoderLayer(nn.Module):
    forward = DecoderLayer.forward
    fusable = False   # its projections all-reduce: never one fused op

    def __init__(self, spec: ModelSpec, group: TPGroup):
        super().__init__()
        self.self_attn = ParallelAttention(spec, group)
        self.mlp = ParallelMLP(spec, group)
        self.input_layernorm = nn.Parameter(torch.ones(spec.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(spec.hidden_size))
        self.eps = spec.rms_norm_eps


class ParallelLlamaModel(LlamaFamilyModel):
    """This rank's shard of a Llama-family model; ``compute_logits`` returns the full vocabulary.
    Its PDL scope names no token rows: the large-model row rule was not measured across ranks."""

    pdl_by_rows = False

    def __init__(self, spec: ModelSpec, cos_sin_cache: torch.Tensor, group: TPGroup):
        nn.Module.__init__(self)
        self.spec, self.group = spec, group
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, group)
        self.layers = nn.ModuleList(ParallelDecoderLayer(spec, group) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.ones(spec.hidden_size))
        if spec.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Parameter(torch.zeros(self.embed_tokens.per_rank, spec.hidden_size))
            self.lm_head.weight_loader = self.embed_tokens.load_rows
        self.register_buffer("cos_sin_cache", cos_sin_cache, persistent=False)
        hkv = self.layers[0].self_attn.num_kv_heads if spec.num_layers else spec.num_kv_heads
        self.kv_spec = replace(spec, num_kv_heads=hkv)   # this rank's share of the KV cache

    def compute_logits(self, hidden: torch.Tensor, rows: Optional[int] = None) -> torch.Tensor:
        """hidden: [M, hidden] -> logits [M, vocab] (gathered over ranks) in the model dtype.
        ``rows`` (the forward's token rows) is unused: the vocabulary-parallel head launches
        outside a PDL scope."""
        return self.embed_tokens.logits(hidden, self.lm_head_weight)
