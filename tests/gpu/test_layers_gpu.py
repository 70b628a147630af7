"""Triton layer kernels vs the torch reference on a real GPU, at real shapes (Llama-8B-like heads).

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_layers_gpu.py -s`` (``-s`` shows timings).

Tolerances (outputs are O(1)):
- attention fp32: 1e-4 absolute vs the reference and vs a float64 dense oracle (both fp32
  accumulations, different order; the Triton dots run in IEEE fp32, not TF32).
- attention bf16: 2e-2 absolute (Triton rounds P to bf16 before P@V, relative error <= 2^-9 per
  term, plus the final bf16 rounding of 2^-9 relative).
- elementwise kernels: bf16 within one bf16 ulp (rtol 2^-7, atol 1e-3 near zero: the reduction
  order of RMSNorm and the exp of SiLU may differ by an fp32 ulp before rounding); fp32 1e-5.
- write_kv: bit-exact.
"""

from __future__ import annotations

import random

import pytest
import torch

from specserve.bench.timing import capture_graph
from tests.kernels.layer_cases import dense_attention, make_paged_case, rotary_cache

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

HQ, HK, D, BLOCK = 32, 8, 128, 16
ATTN_ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
ELEM_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-3, rtol=2 ** -7)}


def _mixed_batch(num_reqs: int, seed: int) -> tuple[list[int], list[int]]:
    """Prefill chunks, decodes and k+1 = 5 verifications, contexts up to ~2k tokens."""
    rnd = random.Random(seed)
    q_lens, seq_lens = [], []
    for i in range(num_reqs):
        kind = i % 8
        if kind == 0:       # prefill chunk, sometimes after a cached prefix
            q = rnd.randint(50, 700)
            s = q + rnd.choice([0, rnd.randint(1, 900)])
        elif kind < 5:      # decode
            q, s = 1, rnd.randint(1, 2048)
        else:               # verification of 4 draft tokens
            q = 5
            s = rnd.randint(5, 2048)
        q_lens.append(q)
        seq_lens.append(s)
    q_lens[-1] = 0          # a request with nothing to compute this step
    return q_lens, seq_lens


def _run(case, splits=None):
    from specserve.kernels import ref_layers, triton_attention

    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale)
    got = triton_attention.paged_attention(*args, case.max_query_len, case.max_seq_len,
                                           num_splits=splits)
    return got, ref_layers.paged_attention(*args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_reqs", [1, 9, 64])
def test_paged_attention_mixed_batch(dtype: torch.dtype, num_reqs: int) -> None:
    q_lens, seq_lens = _mixed_batch(num_reqs, seed=num_reqs)
    if num_reqs == 1:
        q_lens, seq_lens = [300], [1000]
    case = make_paged_case(q_lens, seq_lens, HQ, HK, D, BLOCK, dtype, seed=num_reqs,
                           pad_rows=3, device="cuda")
    got, want = _run(case)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want.float(), atol=ATTN_ATOL[dtype], rtol=0)
    oracle = dense_attention(case).cuda()
    torch.testing.assert_close(got.double(), oracle, atol=ATTN_ATOL[dtype], rtol=0)
    assert (got[-3:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("splits", [None, 2, 8, 32])
def test_paged_attention_decode_split_kv(dtype: torch.dtype, splits) -> None:
    """Decode / verify batches that the heuristic (None) or the caller splits over the context."""
    q_lens, seq_lens = [1, 1, 5, 1], [4000, 17, 1500, 1]
    case = make_paged_case(q_lens, seq_lens, HQ, HK, D, BLOCK, dtype, seed=2, pad_rows=1,
                           device="cuda")
    got, want = _run(case, splits)
    torch.testing.assert_close(got.float(), want.float(), atol=ATTN_ATOL[dtype], rtol=0)
    assert (got[-1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_elementwise_kernels(dtype: torch.dtype) -> None:
    from specserve.kernels import ref_layers, triton_layers

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 4096, device="cuda", generator=gen).to(dtype)
    res = torch.randn(64, 4096, device="cuda", generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(4096, device="cuda", generator=gen)).to(dtype)
    tol = ELEM_TOL[dtype]
    torch.testing.assert_close(triton_layers.rms_norm(x, w, 1e-5), ref_layers.rms_norm(x, w, 1e-5), **tol)
    normed, new_res = triton_layers.add_rms_norm(x, res, w, 1e-5)
    want_normed, want_res = ref_layers.add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(new_res, want_res)
    torch.testing.assert_close(normed, want_normed, **tol)

    gate_up = torch.randn(64, 2 * 14336, device="cuda", generator=gen).to(dtype)
    torch.testing.assert_close(triton_layers.silu_and_mul(gate_up), ref_layers.silu_and_mul(gate_up), **tol)

    q = torch.randn(64, HQ, D, device="cuda", generator=gen).to(dtype)
    k = torch.randn(64, HK, D, device="cuda", generator=gen).to(dtype)
    positions = torch.randint(0, 8192, (64,), device="cuda", generator=gen)
    cache = rotary_cache(8192, D, base=500000.0).cuda()
    q_t, k_t = triton_layers.apply_rotary(q.clone(), k.clone(), positions, cache)
    q_r, k_r = ref_layers.apply_rotary(q.clone(), k.clone(), positions, cache)
    torch.testing.assert_close(q_t, q_r, **tol)
    torch.testing.assert_close(k_t, k_r, **tol)

    k_cache = torch.zeros(40, BLOCK, HK, D, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(40 * BLOCK, device="cuda", generator=gen)[:64]
    slots[::7] = -1
    triton_layers.write_kv(k, k * 2, k_cache, v_cache, slots)
    ref_layers.write_kv(k, k * 2, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)

    # the fused prologue (Qwen3-8B shapes: q/k norm, full rotary) against the reference op
    qkv = torch.randn(64, (HQ + 2 * HK) * D, device="cuda", generator=gen).to(dtype)
    norms = [(1 + 0.1 * torch.randn(D, device="cuda", generator=gen)).to(dtype) for _ in range(2)]
    caches = [torch.zeros(40, BLOCK, HK, D, device="cuda", dtype=dtype) for _ in range(4)]
    q_t = triton_layers.attention_prologue(qkv, HQ, HK, D, *norms, 1e-6, positions, cache,
                                           caches[0], caches[1], slots)
    q_r = ref_layers.attention_prologue(qkv, HQ, HK, D, *norms, 1e-6, positions, cache,
                                        caches[2], caches[3], slots)
    torch.testing.assert_close(q_t, q_r, **tol)
    torch.testing.assert_close(caches[0], caches[2], **tol)
    assert torch.equal(caches[1], caches[3])


def _time_us(fn, iters: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


@pytest.mark.parametrize("context", [1024, 8192])
def test_decode_attention_timing(context: int) -> None:
    """Not asserted: prints decode attention time and KV bandwidth at batch 1 and 64 (bf16)."""
    from specserve.kernels import ref_layers, triton_attention

    for batch in (1, 64):
        case = make_paged_case([1] * batch, [context] * batch, HQ, HK, D, BLOCK, torch.bfloat16,
                               seed=batch, device="cuda")
        args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
                case.seq_lens, case.scale)
        t_triton = _time_us(lambda: triton_attention.paged_attention(*args, 1, context))
        t_ref = _time_us(lambda: ref_layers.paged_attention(*args), iters=5)
        kv_bytes = 2 * batch * context * HK * D * 2
        print(f"\ndecode attention bf16 batch={batch} context={context}: triton {t_triton:.1f} us "
              f"({kv_bytes / t_triton / 1e3:.0f} GB/s of KV), torch reference {t_ref:.1f} us")


@pytest.mark.parametrize("heads", [(32, 8), (16, 8)], ids=["8b", "0.6b"])
@pytest.mark.parametrize("batch,context", [(1, 130), (1, 1500), (4, 700), (16, 300), (64, 2000)])
def test_decode_attention_bit_equal_to_two_kernels(heads: tuple[int, int], batch: int,
                                                   context: int) -> None:
    """Attention with its prologue inside (triton_decode_attention), bf16, Qwen3 q/k norms, the
    split count the heuristic picks under a graph's 4096-token bound: output and caches equal
    to the prologue kernel + the attention kernel bit for bit, eagerly and over 20 replays of
    a CUDA graph (where programs of every split run at once: a key or value written by the
    wrong split, or read before the barrier, shows as NaN or a difference). Request contexts
    differ, so the new position falls in different splits; row 0 is idle (slot -1) from batch 4."""
    from specserve.kernels import triton_attention, triton_decode_attention, triton_layers
    from tests.kernels.layer_cases import decode_step

    hq, hk = heads
    seq_lens = [max(1, context - 37 * i) for i in range(batch)]
    step = decode_step(seq_lens, hq, hk, D, BLOCK, torch.bfloat16, seed=batch + context,
                       qk_norm=True, rot_dim=D, pad_rows=2, idle_rows=(0,) if batch >= 4 else (),
                       device="cuda")
    c = step.case
    common, meta = step.prologue_args(hq, hk, D), step.meta()
    k2, v2 = c.k_cache.clone(), c.v_cache.clone()
    q = triton_layers.attention_prologue(*common, k2, v2, step.slots)
    want = triton_attention.paged_attention(q, k2, v2, *meta, 1, 4096)

    def fused():
        return triton_decode_attention.decode_attention(*common, c.k_cache, c.v_cache, step.slots,
                                                        *meta, 4096)

    got = fused()
    assert not want.isnan().any() and torch.equal(got, want)
    assert torch.equal(c.k_cache.nan_to_num(7.0), k2.nan_to_num(7.0))
    assert torch.equal(c.v_cache.nan_to_num(7.0), v2.nan_to_num(7.0))
    for s in step.slots.tolist():          # poison the step's slots again: replays must rewrite
        if s >= 0:
            c.k_cache.view(-1, hk, D)[s] = float("nan")
            c.v_cache.view(-1, hk, D)[s] = float("nan")
    graph, out = capture_graph(fused)
    for _ in range(20):
        for s in step.slots.tolist():
            if s >= 0:
                c.k_cache.view(-1, hk, D)[s] = float("nan")
                c.v_cache.view(-1, hk, D)[s] = float("nan")
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(c.k_cache.nan_to_num(7.0), k2.nan_to_num(7.0))
        assert torch.equal(c.v_cache.nan_to_num(7.0), v2.nan_to_num(7.0))
