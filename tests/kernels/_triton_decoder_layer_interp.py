"""The fused decoder layer (kernels/triton_decoder_layer.py) under the CPU interpreter against
the same layer run op by op on the torch reference (run by test_triton_decoder_layer.py).

Not collected by a plain ``pytest`` run: TRITON_INTERPRET=1 must be set before Triton kernel
modules are imported. The interpreter runs one program, which passes every grid barrier alone;
the barrier across programs is covered by tests/gpu/test_fused_layer_gpu.py.

Cases: decode rows, a 2-token catch-up, a row past the last request (CUDA-graph padding, slot -1), with and without the first layer's missing residual, Qwen3's q/k norm and
Qwen2's qkv bias; the paged cache's unused slots hold NaN, so a read outside a request's context
shows. Tolerances: fp32 1e-4 absolute on outputs of O(1) (the same fp32 sums in another order);
fp16 2e-2 (values are rounded to fp16 at the same points, but a sum in another order can round
to the neighbouring fp16 value, and the error passes through two projections).
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)

try:
    from tests.kernels.layer_cases import make_paged_case, rotary_cache, step_rows
except ImportError:  # rootdir-less runs of this directory
    from layer_cases import make_paged_case, rotary_cache, step_rows

from specserve.engine.models.llama import AttentionMetadata, DecoderLayer
from specserve.engine.models.spec import ModelSpec
from specserve.kernels import backend, ops

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 64, 96, 4, 2, 16, 4
ATOL = {torch.float32: 1e-4, torch.float16: 2e-2}

# (q_lens, seq_lens, pad_rows): at most MAX_ROWS = 2 rows
MIXES = {
    "decode-1": ([1], [9], 0),
    "decode": ([1, 1], [1, 23], 0),
    "decode-padded": ([1], [9], 1),
    "catch-up": ([2], [14], 0),
}


def _layer(dtype: torch.dtype, qk_norm: bool, qkv_bias: bool, seed: int) -> DecoderLayer:
    spec = ModelSpec(path="", architecture="LlamaForCausalLM", vocab_size=32, hidden_size=HIDDEN,
                     intermediate_size=INTER, num_layers=1, num_heads=HEADS,
                     num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                     max_position_embeddings=64, tie_word_embeddings=False, qkv_bias=qkv_bias,
                     o_bias=False, mlp_bias=False, qk_norm=qk_norm, rope_type="default",
                     config_dtype="float32")
    layer = DecoderLayer(spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            fan_in = p.shape[-1] if p.dim() == 2 else 1
            scale = fan_in ** -0.5 if p.dim() == 2 else 0.2
            base = 1.0 if "norm" in name or "layernorm" in name else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return layer.to(dtype)


def _inputs(dtype, mix, seed, with_residual):
    q_lens, seq_lens, pad = MIXES[mix]
    case = make_paged_case(q_lens, seq_lens, HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, seed,
                           pad_rows=pad)
    slots, positions = step_rows(case, q_lens, seq_lens, pad)   # their slots are rewritten
    meta = AttentionMetadata(torch.tensor(slots), case.block_tables, case.query_start_loc,
                             case.seq_lens, case.max_query_len, case.max_seq_len)
    gen = torch.Generator().manual_seed(seed + 1)
    n = len(slots)
    x = torch.randn(n, HIDDEN, generator=gen).to(dtype)
    residual = torch.randn(n, HIDDEN, generator=gen).to(dtype) if with_residual else None
    return x, residual, torch.tensor(positions), meta, case.k_cache, case.v_cache


@torch.inference_mode()   # as the engine runs its models
def _run(layer, x, residual, positions, meta, k_cache, v_cache, fused: bool):
    cos_sin = rotary_cache(64, HEAD_DIM)
    kc, vc = k_cache.clone(), v_cache.clone()
    if fused:
        backend.set_backend("triton")
        ops.set_fused_layer(True)
        try:
            out = ops.decoder_layer(x, residual, layer.weights(), positions, cos_sin,
                                    meta.slot_mapping, meta.block_tables, meta.query_start_loc,
                                    meta.seq_lens, meta.max_query_len, meta.max_seq_len, kc, vc)
        finally:
            ops.set_fused_layer(False)
        assert out is not None, "the fused layer declined the call"
    else:
        backend.set_backend("torch")
        out = layer(x, residual, positions, cos_sin, meta, (kc, vc))
    return out, kc, vc


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("variant", ["qwen3", "qwen2", "llama-first-layer"])
def test_fused_layer_matches_the_layer_op_by_op(mix, dtype, variant):
    layer = _layer(dtype, qk_norm=variant == "qwen3", qkv_bias=variant == "qwen2", seed=3)
    inputs = _inputs(dtype, mix, seed=5, with_residual=variant != "llama-first-layer")
    (out, h), kc, vc = _run(layer, *inputs, fused=True)
    (want_out, want_h), want_kc, want_vc = _run(layer, *inputs, fused=False)
    atol = ATOL[dtype]
    torch.testing.assert_close(h.float(), want_h.float(), atol=atol, rtol=0)
    torch.testing.assert_close(out.float(), want_out.float(), atol=atol, rtol=0)
    # the cache: this step's slots written alike, every other slot untouched (NaN stays NaN)
    torch.testing.assert_close(kc.float(), want_kc.float(), atol=atol, rtol=0, equal_nan=True)
    torch.testing.assert_close(vc.float(), want_vc.float(), atol=atol, rtol=0, equal_nan=True)


@pytest.mark.parametrize("splits", [2, 4])
def test_fused_layer_with_split_attention(splits, monkeypatch):
    from specserve.kernels import triton_decoder_layer

    monkeypatch.setattr(triton_decoder_layer, "force_splits", splits)
    layer = _layer(torch.float32, qk_norm=True, qkv_bias=False, seed=4)
    inputs = _inputs(torch.float32, "decode", seed=6, with_residual=True)
    (out, h), kc, _ = _run(layer, *inputs, fused=True)
    (want_out, want_h), want_kc, _ = _run(layer, *inputs, fused=False)
    torch.testing.assert_close(out, want_out, atol=1e-4, rtol=0)
    torch.testing.assert_close(h, want_h, atol=1e-4, rtol=0)
    torch.testing.assert_close(kc, want_kc, atol=1e-4, rtol=0, equal_nan=True)


def test_fused_layer_with_several_tiles_per_program(monkeypatch):
    """Small weight tiles: the one interpreted program takes every tile of a projection in turn,
    loading the next while it computes the current (the MULTI_* path)."""
    from specserve.kernels import triton_decoder_layer

    monkeypatch.setattr(triton_decoder_layer, "TILE_ELEMS", 512)
    layer = _layer(torch.float32, qk_norm=True, qkv_bias=True, seed=5)
    inputs = _inputs(torch.float32, "decode", seed=7, with_residual=True)
    (out, h), kc, vc = _run(layer, *inputs, fused=True)
    (want_out, want_h), want_kc, want_vc = _run(layer, *inputs, fused=False)
    torch.testing.assert_close(out, want_out, atol=1e-4, rtol=0)
    torch.testing.assert_close(h, want_h, atol=1e-4, rtol=0)
    torch.testing.assert_close(vc, want_vc, atol=1e-4, rtol=0, equal_nan=True)


def test_fused_layer_declines_what_it_does_not_cover():
    layer = _layer(torch.float32, qk_norm=True, qkv_bias=False, seed=3)
    x, residual, positions, meta, kc, vc = _inputs(torch.float32, "decode", 5, True)
    backend.set_backend("triton")
    args = (layer.weights(), positions, rotary_cache(64, HEAD_DIM), meta.slot_mapping,
            meta.block_tables, meta.query_start_loc, meta.seq_lens, meta.max_query_len,
            meta.max_seq_len, kc, vc)
    assert ops.decoder_layer(x, residual, *args) is None          # off by default
    ops.set_fused_layer(True)
    try:
        wide = torch.randn(3, HIDDEN)                              # more rows than MAX_ROWS
        assert ops.decoder_layer(wide, torch.randn(3, HIDDEN), *args) is None
        assert ops.decoder_layer(x, residual, *args) is not None
    finally:
        ops.set_fused_layer(False)
