"""The attention prologue as Triton functions: what happens between the QKV projection and
attention (twin of :func:`kernels.ref_layers.attention_prologue`).

One unit of work is one token's share of one KV head: its ``G = Hq / Hk`` query heads
(normalised per head when the model has q/k norms, then rotated) and its key and value head,
written to the token's cache slot. Three kernels call :func:`prologue_group` with the same
shapes, so they compute the same bits: the standalone prologue (``triton_layers``, a program per
token and KV head), attention with its prologue inside (``triton_decode_attention``, for launches
of one token per request) and the persistent decoder layer (``triton_decoder_layer``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from specserve.kernels.jit_keys import settle_cache_keys

PROLOGUE_WARPS = 4   # every kernel calling prologue_group runs it with these warps (same bits)


@triton.jit
def cos_sin_rows(pos_ptr, token, cache_ptr, stride_cache, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """The token's rotary cos and sin rows ([1, HALF_PAD]; padding lanes rotate by nothing) and
    the lane offsets they are laid out on."""
    pos = tl.load(pos_ptr + token).to(tl.int64)
    offs_i = tl.arange(0, HALF_PAD)
    ok = offs_i < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_i, mask=ok, other=1.0)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_i, mask=ok, other=0.0)[None, :]
    return cos, sin, offs_i



@triton.jit
def _norm_rope_heads(src, dst, num_heads, w_ptr, eps, cos, sin, offs_i,
                     HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
                     TAIL: tl.constexpr, TAIL_PAD: tl.constexpr, H_PAD: tl.constexpr):
    """One token's heads [num_heads, HEAD_DIM] from ``src`` to ``dst`` (both head-major, unit
    stride): optional RMSNorm per head (rounded like rms_norm), then rotary on the first 2 HALF
    dims (rounded like apply_rotary); dims past 2 HALF are only normalised."""
    offs_h = tl.arange(0, H_PAD)[:, None]
    ok_h = offs_h < num_heads
    lo_m = ok_h & (offs_i[None, :] < HALF)
    lo_off = offs_h * HEAD_DIM + offs_i[None, :]
    x1 = tl.load(src + lo_off, mask=lo_m, other=0.0)
    x2 = tl.load(src + lo_off + HALF, mask=lo_m, other=0.0)
    dtype = x1.dtype
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    if TAIL > 0:
        offs_t = tl.arange(0, TAIL_PAD)[None, :]
        t_m = ok_h & (offs_t < TAIL)
        t_off = offs_h * HEAD_DIM + 2 * HALF + offs_t
        xtf = tl.load(src + t_off, mask=t_m, other=0.0).to(tl.float32)
    if HAS_NORM:
        ss = tl.sum(x1f * x1f, axis=1) + tl.sum(x2f * x2f, axis=1)
        if TAIL > 0:
            ss += tl.sum(xtf * xtf, axis=1)
        inv = tl.rsqrt(ss / HEAD_DIM + eps)[:, None]
        w1 = tl.load(w_ptr + offs_i, mask=offs_i < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs_i, mask=offs_i < HALF, other=0.0).to(tl.float32)[None, :]
        x1f = ((x1f * inv).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2f = ((x2f * inv).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
        if TAIL > 0:
            wt = tl.load(w_ptr + 2 * HALF + offs_t, mask=offs_t < TAIL, other=0.0).to(tl.float32)
            xtf = ((xtf * inv).to(dtype).to(tl.float32) * wt).to(dtype).to(tl.float32)
    tl.store(dst + lo_off, (x1f * cos - x2f * sin).to(dst.dtype.element_ty), mask=lo_m)
    tl.store(dst + lo_off + HALF, (x2f * cos + x1f * sin).to(dst.dtype.element_ty), mask=lo_m)
    if TAIL > 0:
        tl.store(dst + t_off, xtf.to(dst.dtype.element_ty), mask=t_m)


@triton.jit
def prologue_group(token, kv_head, qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, qw_ptr, kw_ptr,
                   pos_ptr, cache_ptr, slot_ptr, eps, write_kv, stride_qkv, stride_qo,
                   stride_cache, stride_kcb, stride_kcs, stride_vcb, stride_vcs,
                   NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                   GROUP_PAD: tl.constexpr, HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr,
                   D_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   TAIL: tl.constexpr, TAIL_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Token ``token`` (int64), KV head ``kv_head``: its GROUP query heads -> ``q_out`` (rows of
    [Hq, D]); when ``write_kv`` and the token's slot is not negative, its key head (normalised,
    rotated) and value head -> the caches at that slot (slots of [Hk, D])."""
    cos, sin, offs_i = cos_sin_rows(pos_ptr, token, cache_ptr, stride_cache, HALF, HALF_PAD)
    row = qkv_ptr + token * stride_qkv
    first = kv_head * GROUP * HEAD_DIM
    _norm_rope_heads(row + first, q_out_ptr + token * stride_qo + first, GROUP, qw_ptr, eps, cos,
                     sin, offs_i, HAS_NORM, HEAD_DIM, HALF, TAIL, TAIL_PAD, GROUP_PAD)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if write_kv & (slot >= 0):
        k_src = row + (NUM_Q_HEADS + kv_head) * HEAD_DIM
        at = kv_head * HEAD_DIM
        k_dst = k_cache_ptr + (slot // BLOCK_SIZE) * stride_kcb + (slot % BLOCK_SIZE) * stride_kcs
        _norm_rope_heads(k_src, k_dst + at, 1, kw_ptr, eps, cos, sin, offs_i, HAS_NORM, HEAD_DIM,
                         HALF, TAIL, TAIL_PAD, 1)
        offs_d = tl.arange(0, D_PAD)
        v = tl.load(k_src + NUM_KV_HEADS * HEAD_DIM + offs_d, mask=offs_d < HEAD_DIM)
        v_dst = v_cache_ptr + (slot // BLOCK_SIZE) * stride_vcb + (slot % BLOCK_SIZE) * stride_vcs
        tl.store(v_dst + at + offs_d, v.to(v_cache_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def check_cache_layout(k_cache, v_cache, head_dim: int) -> None:
    """The prologue writes a slot's heads as one contiguous [Hk, D] row."""
    for c in (k_cache, v_cache):
        if c.stride(-1) != 1 or c.stride(-2) != head_dim:
            raise ValueError("the attention prologue needs caches with contiguous [heads, head_dim] slots")


def constexprs(num_heads: int, num_kv_heads: int, head_dim: int, rotary_dims: int,
               has_norm: bool, block_size: int) -> dict:
    """The compile-time arguments of :func:`prologue_group` (the same for every kernel that
    calls it, so they compute the same bits). ``rotary_dims``: the cos | sin cache's width."""
    half = rotary_dims // 2
    tail = head_dim - 2 * half
    group = num_heads // num_kv_heads
    return dict(NUM_Q_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group,
                GROUP_PAD=triton.next_power_of_2(group), HAS_NORM=has_norm, HEAD_DIM=head_dim,
                D_PAD=triton.next_power_of_2(head_dim), HALF=half,
                HALF_PAD=triton.next_power_of_2(max(half, 1)), TAIL=tail,
                TAIL_PAD=triton.next_power_of_2(max(tail, 1)), BLOCK_SIZE=block_size)


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
