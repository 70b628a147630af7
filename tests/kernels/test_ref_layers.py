"""The torch reference layer kernels against naive dense implementations and transformers.

Tolerances: fp32 results vs a float64 oracle within 2e-5 (absolute, values are O(1));
bf16 within 2e-2 (bf16 has 8 mantissa bits: one rounding of O(1) values is <= 4e-3).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specserve.kernels import ref_layers

try:
    from tests.kernels.layer_cases import MIXES, dense_attention, make_paged_case, rotary_cache
except ImportError:  # rootdir-less runs of this directory
    from layer_cases import MIXES, dense_attention, make_paged_case, rotary_cache

ATOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_paged_attention_matches_dense(mix: str, block_size: int, heads: tuple[int, int]) -> None:
    q_lens, seq_lens = MIXES[mix]
    case = make_paged_case(q_lens, seq_lens, heads[0], heads[1], 16, block_size, torch.float32,
                           seed=len(mix) * 100 + block_size + heads[1], pad_rows=3)
    out = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                     case.query_start_loc, case.seq_lens, case.scale,
                                     case.max_query_len, case.max_seq_len)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), dense_attention(case), atol=2e-5, rtol=0)
    assert (out[-3:] == 0).all()  # rows owned by no request


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_attention_low_precision(dtype: torch.dtype) -> None:
    q_lens, seq_lens = MIXES["mixed"]
    case = make_paged_case(q_lens, seq_lens, 8, 2, 32, 4, dtype, seed=7)
    out = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                     case.query_start_loc, case.seq_lens, case.scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), dense_attention(case), atol=ATOL[dtype], rtol=0)


def test_paged_attention_long_prefill_with_short_queries() -> None:
    """A prefill chunk longer than the batched threshold next to decodes, with a cached prefix."""
    case = make_paged_case([40, 1, 4], [100, 64, 9], 4, 2, 16, 16, torch.float32, seed=3)
    out = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                     case.query_start_loc, case.seq_lens, case.scale)
    torch.testing.assert_close(out.double(), dense_attention(case), atol=2e-5, rtol=0)


def test_paged_attention_sees_only_the_past() -> None:
    """Changing a future token's K/V must not change an earlier query's output."""
    case = make_paged_case([6], [10], 2, 1, 8, 4, torch.float32, seed=11)
    args = (case.block_tables, case.query_start_loc, case.seq_lens, case.scale)
    before = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, *args)
    last = int(case.slot_mapping[9])
    case.k_cache.view(-1, 1, 8)[last] += 5.0
    after = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, *args)
    assert torch.equal(before[:5], after[:5])
    assert not torch.equal(before[5], after[5])


def test_write_kv_skips_negative_slots() -> None:
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(5, 2, 4, generator=gen)
    v = torch.randn(5, 2, 4, generator=gen)
    k_cache = torch.zeros(3, 2, 2, 4)
    v_cache = torch.zeros(3, 2, 2, 4)
    slots = torch.tensor([5, -1, 0, 3, -1])
    ref_layers.write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(6, 2, 4), v_cache.view(6, 2, 4)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k[i]) and torch.equal(flat_v[s], v[i])
    untouched = [1, 2, 4]
    assert (flat_k[untouched] == 0).all() and (flat_v[untouched] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(7, 48, generator=gen) * 3).to(dtype)
    res = torch.randn(7, 48, generator=gen).to(dtype)
    norm = LlamaRMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48, generator=gen))
        expect = norm(x)
        expect_add = norm(x + res)
    assert torch.equal(ref_layers.rms_norm(x, norm.weight.detach(), 1e-6), expect)
    normed, new_res = ref_layers.add_rms_norm(x, res, norm.weight.detach(), 1e-6)
    assert torch.equal(new_res, x + res)
    assert torch.equal(normed, expect_add)


@pytest.mark.parametrize("rot_dim", [16, 8])
def test_rotary_matches_transformers(rot_dim: int) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(9, 4, 16, generator=gen)
    k = torch.randn(9, 2, 16, generator=gen)
    positions = torch.randint(0, 100, (9,), generator=gen)
    cache = rotary_cache(128, rot_dim)
    cos, sin = cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]  # [1, N, R]
    # transformers layout [batch, heads, seq, dim]; rotate only the first rot_dim dims
    eq, ek = apply_rotary_pos_emb(q[..., :rot_dim].transpose(0, 1)[None],
                                  k[..., :rot_dim].transpose(0, 1)[None], cos, sin)
    q_out, k_out = ref_layers.apply_rotary(q.clone(), k.clone(), positions, cache)
    torch.testing.assert_close(q_out[..., :rot_dim], eq[0].transpose(0, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(k_out[..., :rot_dim], ek[0].transpose(0, 1), atol=1e-6, rtol=0)
    assert torch.equal(q_out[..., rot_dim:], q[..., rot_dim:])


def test_rotary_is_in_place_and_position_zero_is_identity() -> None:
    q = torch.randn(3, 2, 8)
    k = torch.randn(3, 1, 8)
    q0, k0 = q.clone(), k.clone()
    q_out, k_out = ref_layers.apply_rotary(q, k, torch.zeros(3, dtype=torch.long), rotary_cache(4, 8))
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    torch.testing.assert_close(q, q0, atol=0, rtol=0)
    torch.testing.assert_close(k, k0, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 40, generator=gen).to(dtype)
    gate, up = x[:, :20], x[:, 20:]
    expect = F.silu(gate) * up  # transformers' LlamaMLP order: act(gate) * up, in the model dtype
    assert torch.equal(ref_layers.silu_and_mul(x), expect)
    naive = gate.double() / (1 + torch.exp(-gate.double())) * up.double()
    torch.testing.assert_close(ref_layers.silu_and_mul(x).double(), naive, atol=ATOL[dtype], rtol=0)


def test_a_forwards_memos_follow_metadata_rewritten_in_place() -> None:
    """The reference derives its attention plan, K/V slots and rotary angles once for a
    forward's layers (``ref_layers._Memo``). Engines rewrite their metadata buffers in place
    between forwards: the next call must follow the new values, not the remembered ones."""
    q_lens, seq_lens = MIXES["decode"]
    case = make_paged_case(q_lens, seq_lens, 8, 2, 16, 4, torch.float32, seed=11)
    args = (case.query_start_loc, case.seq_lens, case.scale)
    first = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, *args)
    again = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, *args)
    assert torch.equal(first, again)
    # request 0 (one token of context) reads request 1's blocks from now on (the same buffer,
    # rewritten): its one key is request 1's first token, so its output is that token's V
    case.block_tables[0].copy_(case.block_tables[1])
    moved = ref_layers.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, *args)
    slot = int(case.block_tables[1, 0]) * case.k_cache.shape[1]
    v_first = case.v_cache.view(-1, 2, 16)[slot]                                  # [Hk, D]
    torch.testing.assert_close(moved[0], v_first.repeat_interleave(4, dim=0), atol=1e-6, rtol=0)
    assert not torch.equal(moved[0], first[0]) and torch.equal(moved[1:], first[1:])

    gen = torch.Generator().manual_seed(12)
    k, v = torch.randn(3, 2, 4, generator=gen), torch.randn(3, 2, 4, generator=gen)
    k_cache, v_cache = torch.zeros(4, 2, 2, 4), torch.zeros(4, 2, 2, 4)
    slots = torch.tensor([0, 1, 2])
    ref_layers.write_kv(k, v, k_cache, v_cache, slots)
    slots.copy_(torch.tensor([5, -1, 7]))
    ref_layers.write_kv(2 * k, 2 * v, k_cache, v_cache, slots)
    flat = k_cache.view(8, 2, 4)
    assert torch.equal(flat[5], 2 * k[0]) and torch.equal(flat[7], 2 * k[2])
    assert torch.equal(flat[1], k[1]) and torch.equal(flat[2], k[2])

    cache = rotary_cache(64, 8)
    positions = torch.tensor([3, 9])
    qr, kr = torch.randn(2, 2, 8, generator=gen), torch.randn(2, 1, 8, generator=gen)
    ref_layers.apply_rotary(qr.clone(), kr.clone(), positions, cache)
    positions.copy_(torch.tensor([0, 0]))      # position 0 rotates by nothing
    q_out, k_out = ref_layers.apply_rotary(qr.clone(), kr.clone(), positions, cache)
    assert torch.equal(q_out, qr) and torch.equal(k_out, kr)


def test_a_remembered_value_never_points_into_a_callers_buffer() -> None:
    """Every slot valid: the memo's slots must be its own. Buffer A is written through, then
    rewritten in place; a different tensor holding A's first values must write where they say,
    not where A now points."""
    k, v = torch.ones(2, 1, 4), torch.ones(2, 1, 4)
    k_cache, v_cache = torch.zeros(4, 2, 1, 4), torch.zeros(4, 2, 1, 4)
    a = torch.tensor([0, 1])
    ref_layers.write_kv(k, v, k_cache, v_cache, a)
    a.copy_(torch.tensor([6, 7]))
    ref_layers.write_kv(2 * k, 2 * v, k_cache, v_cache, torch.tensor([0, 1]))
    flat = k_cache.view(8, 1, 4)
    assert (flat[:2] == 2).all() and (flat[6:] == 0).all()


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_a_remembered_plan_gives_a_fresh_ones_bits(mix: str, monkeypatch) -> None:
    """Each layer after a forward's first reads the remembered plan, slots and angles: bit for
    bit what a fresh derivation gives (the memos emptied before each reference call)."""
    q_lens, seq_lens = MIXES[mix]
    case = make_paged_case(q_lens, seq_lens, 8, 2, 16, 4, torch.float32, seed=21, pad_rows=2)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale)
    warm = [ref_layers.paged_attention(*args) for _ in range(2)][-1]
    for name in ("_PLAN", "_KV_SLOTS", "_COS_SIN"):
        monkeypatch.setattr(ref_layers, name, ref_layers._Memo())
    fresh = ref_layers.paged_attention(*args)
    assert torch.equal(warm, fresh)
    assert (warm[-2:] == 0).all()   # rows owned by no request stay zero
