"""Public kernel entry points. Each forwards to the backend selected at start-up.

Backends implement the same functions with the same signatures:
``kernels.ref_layers`` / ``kernels.triton_layers`` (model layers) and
``kernels.ref_sampling`` / ``kernels.triton_sampling`` (sampling and rejection sampling).
The table of them, and the choice, live in :mod:`kernels.backend`; a call here only looks the
chosen module up. The torch references are the CPU path and the test oracle for the Triton twins.
"""

from __future__ import annotations

from specserve.kernels.backend import selected
from specserve.kernels.philox import DRAFT


def linear(x, weight, bias=None):
    """x [M, K] @ weight[N, K].T (+ bias [N]) -> [M, N] in x.dtype (nn.Linear's layout and maths).
    The Triton backend runs a GEMV kernel for a few rows (decode), cuBLAS otherwise."""
    return selected().layers.linear(x, weight, bias)


def set_gemv(flag):
    """Whether ``linear`` may run the Triton GEMV for few rows (``--no-gemv``: False, cuBLAS
    always). Set before CUDA graphs are captured: a captured graph keeps the kernels it had."""
    selected().layers.set_gemv(flag)


def set_fused_layer(flag):
    """Whether ``decoder_layer`` may run a layer as one persistent kernel (Triton backend, a
    few rows of a small model). Off unless a bench or test turns it on: on an H200 it ran the
    0.6B-like draft at 0.97x (1 row) and 0.87x (2 rows) the op-by-op layers
    (docs/bench-h200/fused-layer). Set before CUDA graphs are captured."""
    selected().layers.set_fused_layer(flag)


def fused_layer_enabled():
    """Whether ``decoder_layer`` may take a call at all (the model skips building its arguments
    otherwise)."""
    return selected().layers.fused_layer_enabled()


def decoder_layer(x, residual, weights, positions, cos_sin_cache, slot_mapping, block_tables,
                  query_start_loc, seq_lens, max_query_len, max_seq_len, k_cache, v_cache):
    """A whole decoder layer (``weights``: kernels.decoder_weights.DecoderWeights) as one op ->
    (mlp_out, h) as the layer's ops would give them, or None where the backend has no fused
    path for this call: the caller then runs the layer op by op."""
    return selected().layers.decoder_layer(x, residual, weights, positions, cos_sin_cache,
                                           slot_mapping, block_tables, query_start_loc, seq_lens,
                                           max_query_len, max_seq_len, k_cache, v_cache)


def rms_norm(x, weight, eps):
    return selected().layers.rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps):
    return selected().layers.add_rms_norm(x, residual, weight, eps)


def add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias=None):
    """A layer's RMSNorm and the projection after it: h = x + residual (x when residual is
    None); returns (linear(rms_norm(h, norm_weight, eps), weight, bias), h). The Triton backend
    forms the norm inside the GEMV for one row of the shapes where that measured faster
    (triton_gemv.NORM_PROLOGUE_SHAPES), saving the norm kernel; otherwise it runs the ops apart."""
    return selected().layers.add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias)


def apply_rotary(q, k, positions, cos_sin_cache):
    return selected().layers.apply_rotary(q, k, positions, cos_sin_cache)


def silu_and_mul(x):
    return selected().layers.silu_and_mul(x)


def silu_mul_linear(gate_up, weight, bias=None):
    """linear(silu_and_mul(gate_up), weight, bias): gate_up [M, 2I] (gate | up), weight [N, I]
    -> [M, N]. The Triton backend fuses the activation into the GEMV for a few rows (decode),
    bit for bit equal to the two ops; otherwise it runs them apart."""
    return selected().layers.silu_mul_linear(gate_up, weight, bias)


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    return selected().layers.write_kv(k, v, k_cache, v_cache, slot_mapping)


def attention_prologue(qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions,
                       cos_sin_cache, k_cache, v_cache, slot_mapping):
    """q/k norm (optional) + rotary + KV-cache write from the fused QKV projection; returns q."""
    return selected().layers.attention_prologue(qkv, num_heads, num_kv_heads, head_dim, q_norm,
                                                k_norm, eps, positions, cos_sin_cache, k_cache,
                                                v_cache, slot_mapping)


def paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                    max_query_len=None, max_seq_len=None):
    return selected().layers.paged_attention(q, k_cache, v_cache, block_tables, query_start_loc,
                                             seq_lens, scale, max_query_len, max_seq_len)


def attention_with_prologue(qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps,
                            positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                            block_tables, query_start_loc, seq_lens, scale, max_query_len=None,
                            max_seq_len=None):
    """``attention_prologue`` then ``paged_attention`` over its q. The Triton backend runs the
    two as one launch where every request has one query token (``max_query_len`` 1: decode
    steps, the draft's proposal passes), with the same result bit for bit."""
    return selected().layers.attention_with_prologue(
        qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions, cos_sin_cache,
        k_cache, v_cache, slot_mapping, block_tables, query_start_loc, seq_lens, scale,
        max_query_len, max_seq_len)


def set_decode_fusion(flag):
    """Whether ``attention_with_prologue`` may fuse one-token launches (default on; off for A/B
    runs). Set before CUDA graphs are captured."""
    selected().layers.set_decode_fusion(flag)


def set_pdl(flag):
    """Whether Triton kernels may launch while the kernel before them runs (programmatic
    dependent launch, kernels/triton_pdl.py; default on, on GPUs of compute capability 9.0 and
    later): a small model's forward (GEMV, attention, prologue, RMSNorm) inside ``pdl_scope``,
    and the rejection sampler's passes where its tuning asks (Tuning.pdl). Off for A/B runs.
    Changes no result. Set before CUDA graphs are captured."""
    selected().layers.set_pdl(flag)


def pdl_scope(hidden_size, rows=None):
    """A context for a model's launches over ``rows`` token rows: PDL (``set_pdl``) applies
    inside it where it measured faster: models of hidden size up to triton_pdl.MAX_HIDDEN, and
    larger models' forwards of triton_pdl.LARGE_MODEL_ROWS rows."""
    return selected().layers.pdl_scope(hidden_size, rows)


def sample_draft(logits, temperature, top_k, top_p, min_p, seeds, positions, store_probs,
                 probs_out=None, stream=DRAFT):
    """``probs_out`` (a contiguous [B, V] fp32 tensor) receives q instead of a new tensor.
    ``stream``: the Philox stream of the draft's race, ``draft_stream(method)``."""
    return selected().sampling.sample_draft(logits, temperature, top_k, top_p, min_p, seeds,
                                            positions, store_probs, probs_out=probs_out,
                                            stream=stream)


def rejection_sample(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs,
                     temperature, top_k, top_p, min_p, seeds, positions, method,
                     max_num_draft_tokens=None):
    """``max_num_draft_tokens`` (host int) sizes the output without reading the device."""
    return selected().sampling.rejection_sample(target_logits, cu_num_draft_tokens,
                                                draft_token_ids, draft_probs, temperature, top_k,
                                                top_p, min_p, seeds, positions, method,
                                                max_num_draft_tokens)


def warm_up_sampling(vocab, max_reqs, max_drafts, method, with_probs, store_probs, dtype, device):
    """Compile the sampling kernels' variants ahead of traffic (a no-op for the torch backend).
    Returns the number of warm-up calls made."""
    impl = selected().sampling
    if not hasattr(impl, "warm_up"):
        return 0
    return impl.warm_up(vocab, max_reqs, max_drafts, method, with_probs, store_probs, dtype, device)
