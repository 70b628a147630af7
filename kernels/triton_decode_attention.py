"""Attention with its prologue inside, for launches of one query token per request.

A decode step, and each of the draft's proposal passes, runs per layer the attention prologue
(q/k norm, rotary, the KV-cache write) and then attention: two launches, the second waiting for
the first to drain. Here one launch does both. The program of (request, KV head, split):

1. runs its request's token through the prologue for its KV head
   (:func:`triton_prologue.prologue_group`, with the shapes and the 4 warps of the standalone
   prologue kernel, so it computes the same bits), writing the token's query heads to a scratch row
   of its split, and, only in the split whose share of the context holds the new position, the
   token's key and value to the cache;
2. waits at a CTA barrier, which makes those stores visible to all of the program's threads
   (no other program reads them: each split reads only its own scratch, and the new position
   lies in one split's share);
3. attends exactly as :func:`triton_attention.attend_program` does for the attention kernel,
   and the split-KV merge runs as there.

The output, the cache and the merge are those of ``attention_prologue`` + ``paged_attention``
bit for bit (tests/kernels and tests/gpu check it). The two-launch path stays for every other
launch (prefill chunks, verification, the draft's catch-up).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from specserve.kernels import triton_pdl, triton_prologue
from specserve.kernels.triton_attention import (MIX_ARGS, attend_program, find_request, merge_splits,
                                                plan_launch, split_share)
from specserve.kernels.jit_keys import settle_cache_keys
from specserve.kernels.triton_pdl import after_producer
from specserve.kernels.triton_prologue import PROLOGUE_WARPS, prologue_group


@triton.jit(do_not_specialize=MIX_ARGS)
def _decode_attention_kernel(
    qkv_ptr, q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr,
    seq_lens_ptr, ws_acc_ptr, ws_ml_ptr, qw_ptr, kw_ptr, pos_ptr, cache_ptr, slot_ptr,
    eps, scale, num_reqs, num_tokens,
    stride_qkv, stride_cache, stride_q_split,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_bt,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr, HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, ATT_D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    WHILE_LOOP: tl.constexpr, PDL: tl.constexpr = False,
):
    """Grid (tiles, Hk, NUM_SPLITS) as the attention kernel's; q_ptr: scratch [splits, N, Hq, D].
    ``PDL``: launched ahead of the kernel before it (kernels/triton_pdl.py)."""
    after_producer(PDL)
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_split = q_ptr + split * stride_q_split
    req = find_request(query_start_loc_ptr, tile, num_reqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if (tile == q_start // BLOCK_Q + req) & (q_len > 0):       # the request's tile: its token
        seq_len = tl.load(seq_lens_ptr + req)
        # this split's share of the context, cut as attend_program cuts it (one query token)
        kv_lo, kv_hi = split_share(seq_len, seq_len - 1, 0, split, BLOCK_Q, BLOCK_N, NUM_SPLITS)
        holds_new = (kv_lo <= seq_len - 1) & (seq_len - 1 < kv_hi)
        prologue_group(q_start.to(tl.int64), kv_head, qkv_ptr, q_split, k_cache_ptr, v_cache_ptr,
                       qw_ptr, kw_ptr, pos_ptr, cache_ptr, slot_ptr, eps, holds_new, stride_qkv,
                       NUM_Q_HEADS * HEAD_DIM, stride_cache, stride_kb, stride_ks, stride_vb,
                       stride_vs, NUM_Q_HEADS, NUM_KV_HEADS, GROUP, GROUP_PAD, HAS_NORM,
                       HEAD_DIM, D_PAD, HALF, HALF_PAD, TAIL, TAIL_PAD, BLOCK_SIZE)
    tl.debug_barrier()      # the stores above, visible to every thread of this program
    attend_program(
        tile, tl.num_programs(0), kv_head, split,
        q_split, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr,
        seq_lens_ptr, ws_acc_ptr, ws_ml_ptr, scale, num_reqs, num_tokens,
        NUM_Q_HEADS * HEAD_DIM, HEAD_DIM, 1, stride_kb, stride_ks, stride_kh, stride_kd,
        stride_vb, stride_vs, stride_vh, stride_vd, stride_ot, stride_oh, stride_bt,
        NUM_Q_HEADS, GROUP, GROUP_PAD, HEAD_DIM, ATT_D_PAD, BLOCK_SIZE, BLOCK_Q, BLOCK_N,
        NUM_SPLITS, PRECISION, WHILE_LOOP)


def decode_attention(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                     q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor], eps: float,
                     positions: torch.Tensor, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     max_seq_len: Optional[int], num_splits: Optional[int] = None) -> torch.Tensor:
    """``attention_prologue`` then ``paged_attention`` with ``max_query_len`` 1 (every request
    has at most one query token), in one launch (plus the split merge) -> [N, Hq, D], or None
    where the attention tile would run 8 warps (a GQA group over 64 heads): the prologue's
    bits are those of its 4-warp kernel only, so the caller runs the two kernels there.

    Rows past the last request's token (batch padding) get no prologue here: their slots must
    be -1, as the engine's are (the two-kernel path would write a padding row's K/V)."""
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    num_tokens = qkv.shape[0]
    num_reqs = seq_lens.shape[0]
    if num_tokens == 0 or num_reqs == 0:
        return torch.zeros((num_tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    triton_prologue.check_cache_layout(k_cache, v_cache, head_dim)
    launch = plan_launch((num_tokens, num_heads, head_dim), qkv.dtype, qkv.device, num_kv_heads,
                         num_reqs, 1, max_seq_len, num_splits)
    if launch.num_warps != PROLOGUE_WARPS:
        return None
    q = torch.empty((launch.splits, num_tokens, num_heads, head_dim), dtype=qkv.dtype,
                    device=qkv.device)                                # each split's own q rows
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    has_norm = q_norm is not None
    consts = triton_prologue.constexprs(num_heads, num_kv_heads, head_dim, cache.shape[1],
                                        has_norm, k_cache.shape[1])
    att = launch.constexprs(num_heads, head_dim, k_cache.shape[1], qkv.dtype)
    out = launch.out
    pdl = triton_pdl.active(qkv, "attention")
    _decode_attention_kernel[(launch.num_tiles, num_kv_heads, launch.splits)](
        qkv, q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens, launch.ws_acc,
        launch.ws_ml, q_norm if has_norm else qkv, k_norm if has_norm else qkv, positions, cache,
        slot_mapping, eps, scale, num_reqs, num_tokens, qkv.stride(0), cache.stride(0),
        q.stride(0), *k_cache.stride(), *v_cache.stride(), out.stride(0), out.stride(1),
        block_tables.stride(0), **consts, ATT_D_PAD=att["D_PAD"], BLOCK_Q=att["BLOCK_Q"],
        BLOCK_N=att["BLOCK_N"], NUM_SPLITS=att["NUM_SPLITS"], PRECISION=att["PRECISION"],
        WHILE_LOOP=att["WHILE_LOOP"], PDL=pdl, num_warps=PROLOGUE_WARPS,
        **triton_pdl.launch_options(pdl))
    merge_splits(launch, query_start_loc, num_reqs, head_dim, pdl)
    return out


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
