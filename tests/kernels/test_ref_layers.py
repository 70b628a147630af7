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
