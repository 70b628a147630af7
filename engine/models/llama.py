"""The Llama family (Llama, Mistral, Qwen2, Qwen3) as one implementation over the paged KV cache.

Differences are flags on :class:`ModelSpec`: q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3),
tied embeddings, GQA, RoPE scaling. Every hot op goes through :mod:`kernels.ops`.
Attention metadata is passed explicitly (no global context: the draft and target share a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from specserve.engine.models.spec import ModelSpec
from specserve.kernels import ops
from specserve.kernels.decoder_weights import DecoderWeights


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor      # [num_tokens] int64, -1 for padding
    block_tables: torch.Tensor      # [num_reqs, max_blocks] int32
    query_start_loc: torch.Tensor   # [num_reqs + 1] int32
    seq_lens: torch.Tensor          # [num_reqs] int32
    max_query_len: int
    max_seq_len: int


KVCache = tuple[torch.Tensor, torch.Tensor]   # each [num_blocks, block_size, kv_heads, head_dim]


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict names) whose product is ``ops.linear``: the
    Triton backend's GEMV kernel at decode row counts, cuBLAS otherwise; F.linear on CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``self(ops.silu_and_mul(gate_up))`` as one op: the Triton backend forms the activation
        inside the GEMV at decode row counts (bit for bit the same result)."""
        return ops.silu_mul_linear(gate_up, self.weight, self.bias)

    def forward_add_rms_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                             norm_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(self(rms_norm(h)), h)`` with h = x + residual (x when residual is None) as one op:
        the Triton backend normalises inside the GEMV at one row, for the shapes where that
        measured faster (ops.add_rms_norm_linear)."""
        return ops.add_rms_norm_linear(x, residual, norm_weight, eps, self.weight, self.bias)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.qkv_proj = Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = Linear(self.q_size, spec.hidden_size, bias=spec.o_bias)
        self.eps = spec.rms_norm_eps
        if spec.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(spec.head_dim))
            self.k_norm = nn.Parameter(torch.ones(spec.head_dim))
        else:
            self.q_norm = self.k_norm = None
        self.scale = spec.head_dim ** -0.5

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor,
                positions: torch.Tensor, cos_sin: torch.Tensor, meta: AttentionMetadata,
                kv: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input norm (of x + residual) and attention -> (output, new residual)."""
        n = x.shape[0]
        qkv, residual = self.qkv_proj.forward_add_rms_norm(x, residual, norm_weight, self.eps)
        out = ops.attention_with_prologue(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim, self.q_norm, self.k_norm,
            self.eps, positions, cos_sin, kv[0], kv[1], meta.slot_mapping, meta.block_tables,
            meta.query_start_loc, meta.seq_lens, self.scale, meta.max_query_len,
            meta.max_seq_len)                                                 # [N, Hq, D]
        return self.o_proj(out.reshape(n, self.q_size)), residual


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.mlp_bias)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The post-attention norm (of x + residual) and the MLP -> (output, new residual)."""
        gate_up, residual = self.gate_up_proj.forward_add_rms_norm(x, residual, norm_weight, eps)
        return self.down_proj.forward_silu_mul(gate_up), residual         # down(silu(gate) * up)


class DecoderLayer(nn.Module):
    fusable = True   # may run as one op (ops.decoder_layer); not when projections all-reduce

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = nn.Parameter(torch.ones(spec.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(spec.hidden_size))
        self.eps = spec.rms_norm_eps
        # the fused layer's grid-barrier state (count, generation), one per layer
        self.register_buffer("grid_barrier", torch.zeros(2, dtype=torch.int32), persistent=False)

    def weights(self) -> DecoderWeights:
        a, m = self.self_attn, self.mlp
        return DecoderWeights(
            self.input_layernorm, a.qkv_proj.weight, a.qkv_proj.bias, a.q_norm, a.k_norm,
            a.o_proj.weight, a.o_proj.bias, self.post_attention_layernorm,
            m.gate_up_proj.weight, m.gate_up_proj.bias, m.down_proj.weight, m.down_proj.bias,
            a.num_heads, a.num_kv_heads, a.head_dim, self.eps, a.scale, self.grid_barrier)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor], positions: torch.Tensor,
                cos_sin: torch.Tensor, meta: AttentionMetadata, kv: KVCache):
        """x + residual is the residual stream (residual None: the first layer, x the
        embeddings); each norm is fused with the projection after it (ops.add_rms_norm_linear).
        Where the backend runs the whole layer as one op (ops.decoder_layer), it does."""
        if self.fusable and ops.fused_layer_enabled():
            fused = ops.decoder_layer(x, residual, self.weights(), positions, cos_sin,
                                      meta.slot_mapping, meta.block_tables, meta.query_start_loc,
                                      meta.seq_lens, meta.max_query_len, meta.max_seq_len,
                                      kv[0], kv[1])
            if fused is not None:
                return fused
        h, residual = self.self_attn(x, residual, self.input_layernorm, positions, cos_sin, meta, kv)
        return self.mlp(h, residual, self.post_attention_layernorm, self.eps)


class LlamaFamilyModel(nn.Module):
    """Embeddings -> decoder layers -> final norm; ``compute_logits`` applies the LM head."""

    # Whether the model's PDL scope carries its forward's token rows (the large-model row rule,
    # kernels/triton_pdl.LARGE_MODEL_ROWS, measured on one GPU); a tensor-parallel shard, with
    # all-reduces between its kernels, says no rows and keeps the launches it had.
    pdl_by_rows = True

    def __init__(self, spec: ModelSpec, cos_sin_cache: torch.Tensor):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.ones(spec.hidden_size))
        if spec.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        self.register_buffer("cos_sin_cache", cos_sin_cache, persistent=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[KVCache]) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> hidden states [num_tokens, hidden]."""
        x, residual = self.run_layers(self.embed_tokens(input_ids), None, positions, meta,
                                      kv_caches, 0, len(self.layers))
        return self.final_norm(x, residual)

    def run_layers(self, x: torch.Tensor, residual: Optional[torch.Tensor], positions: torch.Tensor,
                   meta: AttentionMetadata, kv_caches: list[KVCache], lo: int,
                   hi: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Decoder layers lo..hi-1 (a forward in pieces: CUDA graphs launch it piece by piece)."""
        with ops.pdl_scope(self.spec.hidden_size, self._pdl_rows(x.shape[0])):
            for i in range(lo, hi):
                x, residual = self.layers[i](x, residual, positions, self.cos_sin_cache, meta,
                                             kv_caches[i])
        return x, residual

    def _pdl_rows(self, rows: int) -> Optional[int]:
        return rows if self.pdl_by_rows else None

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        with ops.pdl_scope(self.spec.hidden_size, self._pdl_rows(x.shape[0])):
            x, _ = ops.add_rms_norm(x, residual, self.norm, self.spec.rms_norm_eps)
        return x

    def compute_logits(self, hidden: torch.Tensor, rows: Optional[int] = None) -> torch.Tensor:
        """hidden: [M, hidden] -> logits [M, vocab] in the model dtype. Inside a PDL scope (the
        model's kernels may launch while the one before runs: kernels/triton_pdl.py), like its
        layers and final norm; ``rows``: the token rows of the forward these rows were picked
        from (default M), so the head launches as the layers did."""
        with ops.pdl_scope(self.spec.hidden_size,
                           self._pdl_rows(hidden.shape[0] if rows is None else rows)):
            return ops.linear(hidden, self.lm_head_weight)
