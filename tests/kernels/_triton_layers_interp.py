"""Triton layer kernels under the CPU interpreter vs the torch reference (run by
test_triton_layers.py).

Not collected by a plain ``pytest`` run (the name does not start with ``test_``): the driver
``tests/kernels/test_triton_layers.py::test_interpreter_suite`` runs this file in a subprocess with
TRITON_INTERPRET=1, which must be set before Triton kernel modules are imported and must not leak
into the rest of the suite. bf16 is not tested here (the interpreter's bf16 arithmetic is
unreliable); tests/gpu/test_layers_gpu.py covers it.

Tolerances vs the reference: fp32 1e-5 absolute (both accumulate in fp32, in a different order);
fp16 attention 2e-3 (P is rounded to fp16 before the P@V product, relative error <= 2^-11 per
term, outputs are O(1)); the elementwise fp16 kernels round exactly like the reference (0).
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)

try:
    from tests.kernels.layer_cases import MIXES, decode_step, make_paged_case, rotary_cache
except ImportError:  # rootdir-less runs of this directory
    from layer_cases import MIXES, decode_step, make_paged_case, rotary_cache

ATTN_ATOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _both(case, splits=None):
    from specserve.kernels import ref_layers, triton_attention

    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale)
    got = triton_attention.paged_attention(*args, case.max_query_len, case.max_seq_len,
                                           num_splits=splits)
    return got, ref_layers.paged_attention(*args)


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_paged_attention_fp32(mix: str, block_size: int, heads: tuple[int, int]) -> None:
    case = make_paged_case(*MIXES[mix], heads[0], heads[1], 16, block_size, torch.float32,
                           seed=len(mix) * 10 + block_size, pad_rows=2)
    got, want = _both(case)
    torch.testing.assert_close(got, want, atol=ATTN_ATOL[torch.float32], rtol=0)
    assert (got[-2:] == 0).all()


@pytest.mark.parametrize("mix", ["mixed", "verify"])
def test_paged_attention_fp16_odd_head_dim(mix: str) -> None:
    """fp16, a head dim that is not a power of two, 3 query heads per KV head, blocks of 4."""
    case = make_paged_case(*MIXES[mix], 6, 2, 24, 4, torch.float16, seed=5)
    got, want = _both(case)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want.float(), atol=ATTN_ATOL[torch.float16], rtol=0)


def _nan_outputs(monkeypatch) -> None:
    """Make the kernel's uninitialised output NaN, so a row it fails to write shows."""
    from specserve.kernels import triton_attention

    real = triton_attention._new_output
    monkeypatch.setattr(triton_attention, "_new_output", lambda *a: real(*a).fill_(float("nan")))


@pytest.mark.parametrize("splits", [2, 4])
def test_paged_attention_split_kv(splits: int, monkeypatch) -> None:
    """Split-KV: partial softmax states merged; splits that see no context for a row are empty;
    the merge writes the padding rows as zeros."""
    _nan_outputs(monkeypatch)
    case = make_paged_case([1, 3, 1, 0], [40, 9, 2, 0], 4, 2, 16, 8, torch.float32, seed=9,
                           pad_rows=1)
    got, want = _both(case, splits=splits)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got[-1] == 0).all()


def test_paged_attention_writes_every_row(monkeypatch) -> None:
    """Without splits, no output row is left unwritten either: the kernel zeroes the padding
    rows (the output is not memset)."""
    _nan_outputs(monkeypatch)
    for pad in (5, 70):      # less than one tile of padding rows, and more than two
        case = make_paged_case(*MIXES["mixed"], 4, 2, 16, 16, torch.float32, seed=3, pad_rows=pad)
        got, want = _both(case)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert (got[-pad:] == 0).all()


def test_paged_attention_through_ops_with_strided_q() -> None:
    """The kernels.ops entry point with q a strided view of a fused qkv tensor."""
    from specserve.kernels import backend, ops, ref_layers

    case = make_paged_case(*MIXES["verify"], 4, 2, 16, 16, torch.float32, seed=4)
    qkv = torch.cat([case.q.flatten(1), torch.zeros(case.q.shape[0], 8)], dim=1)
    q = qkv[:, :64].view(-1, 4, 16)
    backend.set_backend("triton")
    try:
        got = ops.paged_attention(q, case.k_cache, case.v_cache, case.block_tables,
                                  case.query_start_loc, case.seq_lens, case.scale,
                                  case.max_query_len, case.max_seq_len)
    finally:
        backend.set_backend("torch")
    want = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                      case.query_start_loc, case.seq_lens, case.scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_norms(dtype: torch.dtype) -> None:
    from specserve.kernels import ref_layers, triton_layers

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 48, generator=gen) * 2).to(dtype)
    res = torch.randn(5, 48, generator=gen).to(dtype)
    w = torch.randn(48, generator=gen).to(dtype)
    atol = 1e-5 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(triton_layers.rms_norm(x, w, 1e-6), ref_layers.rms_norm(x, w, 1e-6),
                               atol=atol, rtol=0)
    normed, new_res = triton_layers.add_rms_norm(x, res, w, 1e-6)
    want_normed, want_res = ref_layers.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(new_res, want_res)
    torch.testing.assert_close(normed, want_normed, atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul(dtype: torch.dtype) -> None:
    from specserve.kernels import ref_layers, triton_layers

    x = torch.randn(4, 2 * 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    atol = 1e-6 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(triton_layers.silu_and_mul(x), ref_layers.silu_and_mul(x),
                               atol=atol, rtol=0)


@pytest.mark.parametrize("rot_dim", [16, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_in_place(rot_dim: int, dtype: torch.dtype) -> None:
    from specserve.kernels import ref_layers, triton_layers

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, 4, 16, generator=gen).to(dtype)
    k = torch.randn(6, 2, 16, generator=gen).to(dtype)
    positions = torch.randint(0, 60, (6,), generator=gen)
    cache = rotary_cache(64, rot_dim)
    q_t, k_t = q.clone(), k.clone()
    out_q, out_k = triton_layers.apply_rotary(q_t, k_t, positions, cache)
    assert out_q.data_ptr() == q_t.data_ptr() and out_k.data_ptr() == k_t.data_ptr()
    want_q, want_k = ref_layers.apply_rotary(q.clone(), k.clone(), positions, cache)
    atol = 1e-6 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(q_t, want_q, atol=atol, rtol=0)
    torch.testing.assert_close(k_t, want_k, atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_kv(dtype: torch.dtype) -> None:
    from specserve.kernels import ref_layers, triton_layers

    gen = torch.Generator().manual_seed(6)
    k = torch.randn(6, 2, 24, generator=gen).to(dtype)
    v = torch.randn(6, 2, 24, generator=gen).to(dtype)
    slots = torch.tensor([3, -1, 0, 11, -5, 7])
    caches = [torch.full((3, 4, 2, 24), float("nan"), dtype=dtype) for _ in range(4)]
    triton_layers.write_kv(k, v, caches[0], caches[1], slots)
    ref_layers.write_kv(k, v, caches[2], caches[3], slots)
    torch.testing.assert_close(caches[0], caches[2], atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("rot_dim", [16, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_prologue(qk_norm: bool, rot_dim: int, dtype: torch.dtype) -> None:
    """The fused q/k norm + rotary + KV write equals the reference op by op (GQA, partial
    rotary, skipped slots), and leaves its qkv input untouched."""
    from specserve.kernels import ref_layers, triton_layers

    gen = torch.Generator().manual_seed(rot_dim + qk_norm)
    hq, hk, d, n = 6, 2, 16, 7
    qkv = (torch.randn(n, (hq + 2 * hk) * d, generator=gen) * 3).to(dtype)
    weights = [(1 + 0.2 * torch.randn(d, generator=gen)).to(dtype) for _ in range(2)] if qk_norm \
        else [None, None]
    positions = torch.randint(0, 60, (n,), generator=gen)
    cache = rotary_cache(64, rot_dim)
    slots = torch.tensor([3, -1, 0, 11, -5, 7, 9])
    caches = [torch.full((3, 4, hk, d), float("nan"), dtype=dtype) for _ in range(4)]
    before = qkv.clone()
    got = triton_layers.attention_prologue(qkv, hq, hk, d, *weights, 1e-6, positions, cache,
                                           caches[0], caches[1], slots)
    want = ref_layers.attention_prologue(qkv, hq, hk, d, *weights, 1e-6, positions, cache,
                                         caches[2], caches[3], slots)
    assert torch.equal(qkv, before) and got.shape == (n, hq, d) and got.is_contiguous()
    atol = 1e-5 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    torch.testing.assert_close(caches[0], caches[2], atol=atol, rtol=0, equal_nan=True)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0, equal_nan=True)


def test_paged_attention_as_a_ragged_graph_bucket() -> None:
    """How a ragged CUDA graph calls it (engine/runner/ragged_graphs.py): the real requests, then
    zero-length ones starting at the last real token, rows of no request up to the bucket, the
    tile height chosen for a query as long as the bucket and the context bound set high."""
    q_lens, seq_lens = MIXES["mixed"]
    pad_reqs, bucket = 5, 80
    case = make_paged_case(q_lens + [0] * pad_reqs, seq_lens + [0] * pad_reqs, 4, 2, 16, 16,
                           torch.float32, seed=21, pad_rows=bucket - sum(q_lens))
    from specserve.kernels import ref_layers, triton_attention

    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale)
    got = triton_attention.paged_attention(*args, bucket, 1024)
    torch.testing.assert_close(got, ref_layers.paged_attention(*args), atol=1e-5, rtol=0)
    assert (got[sum(q_lens):] == 0).all()


def test_paged_attention_many_requests() -> None:
    """33 requests of random shapes: the tile -> request binary search over query_start_loc."""
    import random

    rnd = random.Random(12)
    q_lens = [rnd.choice([0, 1, 1, 2, 5, 19]) for _ in range(33)]
    seq_lens = [q + rnd.randint(0, 20) for q in q_lens]
    case = make_paged_case(q_lens, seq_lens, 4, 2, 16, 4, torch.float32, seed=12, pad_rows=2)
    got, want = _both(case)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("heads,qk_norm,rot_dim,splits,dtype", [
    ((8, 2), True, 16, 1, torch.float32),      # Qwen3-like: q/k norms, GQA of 4
    ((8, 2), True, 16, 4, torch.float32),      # split-KV: the new position lies in one split
    ((6, 2), False, 8, 2, torch.float32),      # GQA of 3 (padded group), partial rotary
    ((4, 4), False, 16, 2, torch.float16),     # no GQA, fp16
    ((8, 2), True, 16, 2, torch.float16),
])
def test_decode_attention_equals_prologue_then_attention(heads, qk_norm: bool, rot_dim: int,
                                                         splits: int, dtype: torch.dtype,
                                                         monkeypatch) -> None:
    """One token per request: the fused launch (triton_decode_attention) gives the output and
    the caches of the prologue kernel + the attention kernel bit for bit, and the reference's
    to the tolerances above. The step's own slots start as NaN, so attention must read the K/V
    the prologue wrote; a row with slot -1 (an idle draft row) writes nothing; two rows of
    padding come out as zeros. (The interpreter runs programs one after another, so a store
    made by the wrong split still lands before the read here; tests/gpu checks on the device.)"""
    from specserve.kernels import ref_layers, triton_attention, triton_decode_attention, triton_layers

    _nan_outputs(monkeypatch)
    hq, hk = heads
    d, pad = 16, 2
    # contexts 64 / 65 put the new position last in a share / first in the next (shares are
    # whole steps of 32 (fp32) or 64 (fp16) positions)
    step = decode_step([1, 7, 16, 33, 64, 65, 70], hq, hk, d, 4, dtype, seed=hq * 7 + splits,
                       qk_norm=qk_norm, rot_dim=rot_dim, pad_rows=pad, idle_rows=(1,))
    c = step.case
    caches = [x.clone() for x in (c.k_cache, c.v_cache) for _ in range(3)]
    common, meta = step.prologue_args(hq, hk, d), step.meta()
    got = triton_decode_attention.decode_attention(*common, caches[0], caches[3], step.slots,
                                                   *meta, c.max_seq_len, num_splits=splits)
    q = triton_layers.attention_prologue(*common, caches[1], caches[4], step.slots)
    two = triton_attention.paged_attention(q, caches[1], caches[4], *meta, 1, c.max_seq_len,
                                           num_splits=splits)
    want = ref_layers.attention_with_prologue(*common, caches[2], caches[5], step.slots, *meta)
    assert torch.equal(got, two) and not got.isnan().any()
    assert (got[-pad:] == 0).all()
    for a, b in ((0, 1), (3, 4)):
        torch.testing.assert_close(caches[a], caches[b], atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(got, want, atol=ATTN_ATOL[dtype], rtol=0)
    k_atol = 1e-5 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(caches[0], caches[2], atol=k_atol, rtol=0, equal_nan=True)
    torch.testing.assert_close(caches[3], caches[5], atol=0, rtol=0, equal_nan=True)


def test_attention_with_prologue_takes_the_fused_launch_only_for_one_token(monkeypatch) -> None:
    """The op sends max_query_len 1 to the fused launch (unless switched off) and every other
    launch to the two kernels, with the same result either way."""
    from specserve.kernels import triton_layers

    calls = []
    real = triton_layers.decode_attention
    monkeypatch.setattr(triton_layers, "decode_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    hq, hk, d = 4, 2, 16
    step = decode_step([5, 9], hq, hk, d, 4, torch.float32, seed=2, qk_norm=False, rot_dim=d)
    c = step.case
    outs = []
    try:
        for fused, max_q in ((True, 1), (False, 1), (True, 2)):
            triton_layers.set_decode_fusion(fused)
            k, v = c.k_cache.clone(), c.v_cache.clone()
            outs.append(triton_layers.attention_with_prologue(
                *step.prologue_args(hq, hk, d), k, v, step.slots, *step.meta(), max_q,
                c.max_seq_len))
    finally:
        triton_layers.set_decode_fusion(True)
    assert calls == [1]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
