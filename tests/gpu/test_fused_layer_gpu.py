"""The fused decoder layer (kernels/triton_decoder_layer.py) on a real GPU, at a Qwen3-0.6B-like
layer (hidden 1024, 16 query / 8 KV heads of 128, intermediate 3072), against the same layer run
op by op with the Triton kernels, at 1 and 2 rows (its MAX_ROWS).

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_fused_layer_gpu.py``. Here, unlike under
the interpreter, the layer runs as ~264 programs that meet at grid barriers, so these tests are
the ones that see a barrier that lets a program through early (a stage reading what another
has not written yet) or never opens (the test times out).

Tolerance (bf16, outputs of O(1)): 6e-2 absolute and 2e-2 relative per element, mean absolute
difference under 4e-3. Both compute the same roundings with fp32 sums in another order; a sum
that lands next to a rounding boundary moves by one bf16 ulp (2^-8 relative), and that
difference passes through two projections. A stage that read stale or missing data is off by
O(1) (checked by breaking the barrier once, 2026-11-27).
"""

from __future__ import annotations

import random

import pytest
import torch

from specserve.bench.timing import capture_graph
from tests.kernels.layer_cases import make_paged_case, rotary_cache, step_rows

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

HIDDEN, INTER, HQ, HK, D, BLOCK = 1024, 3072, 16, 8, 128, 16


def _layer(seed: int):
    from specserve.engine.models.llama import DecoderLayer
    from specserve.engine.models.spec import ModelSpec

    spec = ModelSpec(path="", architecture="Qwen3ForCausalLM", vocab_size=32, hidden_size=HIDDEN,
                     intermediate_size=INTER, num_layers=1, num_heads=HQ, num_kv_heads=HK,
                     head_dim=D, rms_norm_eps=1e-6, max_position_embeddings=4096,
                     tie_word_embeddings=True, qkv_bias=False, o_bias=False, mlp_bias=False,
                     qk_norm=True, rope_type="default", config_dtype="bfloat16")
    layer = DecoderLayer(spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)
            else:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    return layer.to(device="cuda", dtype=torch.bfloat16)


def _inputs(q_lens: list[int], seq_lens: list[int], seed: int, pad: int = 0):
    from specserve.engine.models.llama import AttentionMetadata

    case = make_paged_case(q_lens, seq_lens, HQ, HK, D, BLOCK, torch.bfloat16, seed,
                           pad_rows=pad, device="cuda")
    slots, positions = step_rows(case, q_lens, seq_lens, pad)
    dev = "cuda"
    meta = AttentionMetadata(torch.tensor(slots, device=dev), case.block_tables,
                             case.query_start_loc, case.seq_lens, case.max_query_len, 4096)
    gen = torch.Generator().manual_seed(seed + 1)
    n = len(slots)
    x = torch.randn(n, HIDDEN, generator=gen).to(dev, torch.bfloat16)
    residual = torch.randn(n, HIDDEN, generator=gen).to(dev, torch.bfloat16)
    return x, residual, torch.tensor(positions, device=dev), meta, case.k_cache, case.v_cache


@torch.inference_mode()   # as the engine runs its models
def _call(layer, x, residual, positions, meta, kc, vc, fused: bool):
    from specserve.kernels import ops

    ops.set_fused_layer(fused)
    try:
        cos_sin = rotary_cache(4096, D).cuda()
        if fused:
            out = ops.decoder_layer(x, residual, layer.weights(), positions, cos_sin,
                                    meta.slot_mapping, meta.block_tables, meta.query_start_loc,
                                    meta.seq_lens, meta.max_query_len, meta.max_seq_len, kc, vc)
            assert out is not None, "the fused layer declined the call"
            return out
        return _op_by_op_rounded(layer, x, residual, positions, cos_sin, meta, kc, vc)
    finally:
        ops.set_fused_layer(False)


def _op_by_op_rounded(layer, x, residual, positions, cos_sin, meta, kc, vc):
    """The layer op by op with the add + RMSNorm kernel apart from each projection: the fused
    layer rounds the normalised row to bf16 like that kernel does, where the GEMV with the norm
    inside (one row of NORM_PROLOGUE_SHAPES / NORM_ONE_ROW shapes) keeps it in fp32, which at one
    row without a padding row moved an element 0.0156 past the tolerance."""
    from specserve.kernels import triton_gemv

    saved = triton_gemv.NORM_PROLOGUE_SHAPES, triton_gemv.NORM_ONE_ROW
    triton_gemv.NORM_PROLOGUE_SHAPES, triton_gemv.NORM_ONE_ROW = frozenset(), {}
    triton_gemv.clear_table_cache()
    try:
        return layer(x, residual, positions, cos_sin, meta, (kc, vc))
    finally:
        triton_gemv.NORM_PROLOGUE_SHAPES, triton_gemv.NORM_ONE_ROW = saved
        triton_gemv.clear_table_cache()


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=6e-2, rtol=2e-2)
    assert (got.float() - want.float()).abs().mean().item() < 4e-3


@pytest.fixture(autouse=True)
def _triton_backend():
    from specserve.kernels import backend

    backend.set_backend("triton")


@pytest.mark.parametrize("shape", ["decode-1", "decode-1-alone", "decode-2", "catch-up-2"])
def test_fused_layer_matches_the_layer_op_by_op(shape: str) -> None:
    _check(shape)


@pytest.mark.parametrize("variant", ["unsplit-attention", "small-tiles"])
def test_fused_layer_variants(variant: str, monkeypatch) -> None:
    """Unsplit attention (every program zeroes its share of the padding rows, no merge stage)
    and 8,192-element tiles (some programs take a second tile of a projection)."""
    from specserve.kernels import triton_decoder_layer

    if variant == "unsplit-attention":
        monkeypatch.setattr(triton_decoder_layer, "force_splits", 1)
    else:
        monkeypatch.setattr(triton_decoder_layer, "TILE_ELEMS", 8192)
    _check("decode-1")


def _check(shape: str) -> None:
    """decode-1: one row and a padding row; decode-1-alone: one row; decode-2: two requests;
    catch-up-2: one request feeding two tokens."""
    rnd = random.Random(shape)
    kind, n = shape.replace("-alone", "").rsplit("-", 1)
    if kind == "decode":
        q_lens = [1] * int(n)
    else:
        q_lens = [2]
    seq_lens = [q + rnd.randint(0, 1500) for q in q_lens]
    layer = _layer(seed=len(q_lens))
    inputs = _inputs(q_lens, seq_lens, seed=len(shape), pad=1 if shape == "decode-1" else 0)
    x, residual, positions, meta, kc, vc = inputs
    kc_f, vc_f, kc_u, vc_u = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    out_f, h_f = _call(layer, x, residual, positions, meta, kc_f, vc_f, fused=True)
    out_u, h_u = _call(layer, x, residual, positions, meta, kc_u, vc_u, fused=False)
    torch.cuda.synchronize()
    _close(h_f, h_u)
    _close(out_f, out_u)
    # k and v come from qkv sums in another order: a bf16 ulp apart at most; NaN slots untouched
    for got, want in ((kc_f, kc_u), (vc_f, vc_u)):
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=2 ** -7,
                                   equal_nan=True)


def test_fused_layer_replays_in_a_cuda_graph() -> None:
    """Captured once, replayed with new inputs: every replay gives what an eager call gives for
    those inputs (the kernel is deterministic: fixed tiles, no atomics on data), and the
    barrier's count is back to 0 after each launch."""
    layer = _layer(seed=7)
    x, residual, positions, meta, kc, vc = _inputs([1, 1], [300, 1200], seed=3)
    layer2 = _layer(seed=8)   # a second layer in the same graph: its own barrier
    from specserve.kernels import ops

    ops.set_fused_layer(True)
    try:
        cos_sin = rotary_cache(4096, D).cuda()

        def two_layers():
            args = (positions, cos_sin, meta.slot_mapping, meta.block_tables,
                    meta.query_start_loc, meta.seq_lens, meta.max_query_len, meta.max_seq_len,
                    kc, vc)
            out, h = ops.decoder_layer(x, residual, layer.weights(), *args)
            return ops.decoder_layer(out, h, layer2.weights(), *args)

        eager = [t.clone() for t in two_layers()]
        graph, static = capture_graph(two_layers)
        gen = torch.Generator(device="cuda").manual_seed(0)
        for i in range(50):
            if i % 10 == 9:   # new inputs, checked against an eager call
                x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(x.dtype))
                graph.replay()
                got = [t.clone() for t in static]
                want = two_layers()
                for g, w in zip(got, want):
                    assert torch.equal(g, w), f"replay {i} differs from the eager call"
            else:
                graph.replay()
                if i == 0:
                    for g, w in zip(static, eager):
                        assert torch.equal(g, w), "the first replay differs from the eager call"
        torch.cuda.synchronize()
        assert layer.grid_barrier[0].item() == 0 and layer2.grid_barrier[0].item() == 0
        assert layer.grid_barrier[1].item() > 0
    finally:
        ops.set_fused_layer(False)
