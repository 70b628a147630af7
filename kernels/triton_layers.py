"""Triton model-layer kernels: twins of :mod:`kernels.ref_layers` with the same signatures.

Imported only when the Triton backend is selected (see :mod:`kernels.ops`). Rounding mirrors the
reference (and transformers): RMSNorm normalises in fp32, rounds to the model dtype and then
multiplies by the weight; the residual sum is rounded before it is normalised; SiLU is rounded
before the product. No function here reads a device value on the host.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from specserve.kernels import triton_gemv, triton_pdl, triton_prologue
from specserve.kernels.interpreter import interpreting
from specserve.kernels.jit_keys import settle_cache_keys
from specserve.kernels.triton_attention import paged_attention
from specserve.kernels.triton_decode_attention import decode_attention
from specserve.kernels.triton_gemv import set_enabled as set_gemv
from specserve.kernels.triton_gemv import silu_mul as _silu_mul
from specserve.kernels.triton_pdl import after_producer
from specserve.kernels.triton_prologue import cos_sin_rows, prologue_group

__all__ = ["linear", "set_gemv", "rms_norm", "add_rms_norm", "add_rms_norm_linear", "apply_rotary",
           "silu_and_mul", "silu_mul_linear", "write_kv", "attention_prologue", "paged_attention",
           "attention_with_prologue", "set_decode_fusion",
           "decoder_layer", "set_fused_layer", "fused_layer_enabled"]


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """x with a unit stride on its last dim (a copy only when it has none)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [M, K] @ weight[N, K].T (+ bias) -> [M, N]: on CUDA (or under the interpreter) while
    the GEMV is enabled, :func:`triton_gemv.linear` (the kernel for up to ``MAX_ROWS`` rows where
    :func:`triton_gemv.gemv_config` names a launch shape, cuBLAS otherwise);
    ``torch.nn.functional.linear`` (cuBLAS) when it is off."""
    if triton_gemv.enabled() and (x.is_cuda or interpreting()):
        return triton_gemv.linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, eps, hidden,
                     stride_x, stride_res, stride_out, stride_res_out,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    """One row per program: [res_out =] x (+ res); out = w * round(norm(x (+ res))). ``PDL``:
    launched ahead of the kernel before it (kernels/triton_pdl.py)."""
    after_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    ok = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)      # rounded like a dtype add
        tl.store(res_out_ptr + row * stride_res_out + offs, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * inv).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def _norm_warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 8192 else 16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [N, H], weight: [H] -> [N, H] in x.dtype."""
    x = _row_major(x)
    num_rows, hidden = x.shape
    out = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    block = triton.next_power_of_2(hidden)
    pdl = triton_pdl.active(x, "norm")
    _rms_norm_kernel[(num_rows,)](x, x, weight, out, out, eps, hidden, x.stride(0), 0,
                                  out.stride(0), 0, HAS_RESIDUAL=False, BLOCK_H=block, PDL=pdl,
                                  num_warps=_norm_warps(block), **triton_pdl.launch_options(pdl))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused new_residual = x + residual; returns (rms_norm(new_residual), new_residual)."""
    x, residual = _row_major(x), _row_major(residual)
    num_rows, hidden = x.shape
    out = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
    new_res = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out, new_res
    block = triton.next_power_of_2(hidden)
    pdl = triton_pdl.active(x, "norm")
    _rms_norm_kernel[(num_rows,)](x, residual, weight, out, new_res, eps, hidden, x.stride(0),
                                  residual.stride(0), out.stride(0), new_res.stride(0),
                                  HAS_RESIDUAL=True, BLOCK_H=block, PDL=pdl,
                                  num_warps=_norm_warps(block), **triton_pdl.launch_options(pdl))
    return out, new_res


def add_rms_norm_linear(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor,
                        eps: float, weight: torch.Tensor,
                        bias: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(h), weight, bias), h) with h = x + residual (x when residual is None).
    While the GEMV is enabled, rows it takes run as one launch that normalises x inside the
    GEMV (:func:`triton_gemv.add_rms_norm_linear`: the norm kernel is saved; the product agrees
    with the two ops to the dtype's rounding); anything else runs the norm and linear apart."""
    if triton_gemv.enabled() and (x.is_cuda or interpreting()):
        fused = triton_gemv.add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias)
        if fused is not None:
            return fused
    if residual is None:
        h, normed = x, rms_norm(x, norm_weight, eps)
    else:
        normed, h = add_rms_norm(x, residual, norm_weight, eps)
    return linear(normed, weight, bias), h


@triton.jit
def _rotate_heads(ptr, token, stride_t, stride_h, num_heads, cos, sin, offs_i,
                  HALF: tl.constexpr, HEADS_PAD: tl.constexpr):
    """In place on one token's [num_heads, 2 * HALF] leading dims: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
    offs_h = tl.arange(0, HEADS_PAD)
    mask = (offs_h[:, None] < num_heads) & (offs_i[None, :] < HALF)
    base = ptr + token * stride_t + offs_h[:, None] * stride_h + offs_i[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base, (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
    tl.store(base + HALF, (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, pos_ptr, cache_ptr, num_q_heads, num_kv_heads,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
                   HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   QH_PAD: tl.constexpr, KH_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cos, sin, offs_i = cos_sin_rows(pos_ptr, token, cache_ptr, stride_cache, HALF, HALF_PAD)
    _rotate_heads(q_ptr, token, stride_qt, stride_qh, num_q_heads, cos, sin, offs_i, HALF, QH_PAD)
    _rotate_heads(k_ptr, token, stride_kt, stride_kh, num_kv_heads, cos, sin, offs_i, HALF, KH_PAD)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotary in place on the first R = cos_sin_cache.shape[1] dims of every head.

    q: [N, Hq, D], k: [N, Hk, D] (last dim unit-stride), positions: [N] int64,
    cos_sin_cache: [max_pos, R] fp32 (cos | sin). Returns (q, k), the same tensors.
    """
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("apply_rotary needs q and k with a unit stride on the head dim")
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return q, k
    cache = _row_major(cos_sin_cache)
    half = cache.shape[1] // 2
    _rotary_kernel[(num_tokens,)](
        q, k, positions, cache, q.shape[1], k.shape[1], q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), cache.stride(0), HALF=half,
        HALF_PAD=triton.next_power_of_2(half), QH_PAD=triton.next_power_of_2(q.shape[1]),
        KH_PAD=triton.next_power_of_2(k.shape[1]), num_warps=4)
    return q, k


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=ok, other=0.0)
    # silu rounded like torch's, then the product: the same function the fused GEMV calls
    tl.store(out_ptr + row * stride_out + offs, _silu_mul(gate, up), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [N, 2I] -> silu(x[:, :I]) * x[:, I:], [N, I]."""
    x = _row_major(x)
    num_rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_rows, inter), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
        x, out, inter, x.stride(0), out.stride(0), BLOCK=block, num_warps=4)
    return out


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """linear(silu_and_mul(gate_up), weight, bias): gate_up [M, 2K] (gate | up), weight [N, K]
    -> [M, N]. While the GEMV is enabled, rows it takes (1..MAX_ROWS, a launch shape for the
    product's (M, N, K)) run as one launch that forms silu(gate) * up per x tile
    (:func:`triton_gemv.silu_mul_linear`), equal to the two ops bit for bit; anything else runs
    the two ops."""
    if triton_gemv.enabled() and (gate_up.is_cuda or interpreting()):
        out = triton_gemv.silu_mul_linear(gate_up, weight, bias)
        if out is not None:
            return out
    return linear(silu_and_mul(gate_up), weight, bias)


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_kv_heads,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     HEADS_PAD: tl.constexpr, D_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_PAD)[:, None]
    offs_d = tl.arange(0, D_PAD)[None, :]
    mask = (offs_h < num_kv_heads) & (offs_d < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + offs_h * stride_kh + offs_d, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + offs_h * stride_vh + offs_d, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + offs_h * stride_kch + offs_d
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + offs_h * stride_vch + offs_d
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store token i's K/V ([N, Hk, D]) at slot_mapping[i] of the paged caches; skip slots < 0."""
    k, v = _row_major(k), _row_major(v)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("write_kv needs caches with a unit stride on the head dim")
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, num_kv_heads, k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1], HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        D_PAD=triton.next_power_of_2(head_dim), num_warps=1 if num_kv_heads * head_dim <= 256 else 4)


@triton.jit
def _attention_prologue_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, qw_ptr, kw_ptr,
                               pos_ptr, cache_ptr, slot_ptr, eps, stride_qkv, stride_qo,
                               stride_cache, stride_kcb, stride_kcs, stride_vcb, stride_vcs,
                               NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                               GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                               HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                               HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr,
                               TAIL_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                               PDL: tl.constexpr = False):
    """Grid (tokens, KV heads): a token's query heads of one KV head -> q_out, its k and v head
    -> the caches at the token's slot. ``PDL``: see kernels/triton_pdl.py."""
    after_producer(PDL)
    prologue_group(tl.program_id(0).to(tl.int64), tl.program_id(1), qkv_ptr, q_out_ptr,
                   k_cache_ptr, v_cache_ptr, qw_ptr, kw_ptr, pos_ptr, cache_ptr, slot_ptr, eps,
                   True, stride_qkv, stride_qo, stride_cache, stride_kcb, stride_kcs, stride_vcb,
                   stride_vcs, NUM_Q_HEADS, NUM_KV_HEADS, GROUP, GROUP_PAD, HAS_NORM, HEAD_DIM,
                   D_PAD, HALF, HALF_PAD, TAIL, TAIL_PAD, BLOCK_SIZE)


def attention_prologue(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor], eps: float,
                       positions: torch.Tensor, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Twin of ref_layers.attention_prologue in one launch (a program per token and KV head)."""
    qkv = _row_major(qkv)
    num_tokens = qkv.shape[0]
    q = torch.empty((num_tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q
    triton_prologue.check_cache_layout(k_cache, v_cache, head_dim)
    cache = _row_major(cos_sin_cache)
    has_norm = q_norm is not None
    pdl = triton_pdl.active(qkv, "prologue")
    _attention_prologue_kernel[(num_tokens, num_kv_heads)](
        qkv, q, k_cache, v_cache, q_norm if has_norm else qkv, k_norm if has_norm else qkv,
        positions, cache, slot_mapping, eps, qkv.stride(0), q.stride(0), cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        **triton_prologue.constexprs(num_heads, num_kv_heads, head_dim, cache.shape[1], has_norm,
                                     k_cache.shape[1]),
        PDL=pdl, num_warps=triton_prologue.PROLOGUE_WARPS, **triton_pdl.launch_options(pdl))
    return q


# Launches of one query token per request run the prologue inside attention
# (triton_decode_attention); False sends them through the two kernels, for A/B runs.
_decode_fusion = True


def set_decode_fusion(flag: bool) -> None:
    global _decode_fusion
    _decode_fusion = bool(flag)


def set_pdl(flag: bool) -> None:
    triton_pdl.set_enabled(flag)


def pdl_scope(hidden_size: int, rows: Optional[int] = None):
    return triton_pdl.model_scope(hidden_size, rows)


def attention_with_prologue(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                            q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor],
                            eps: float, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            max_query_len: Optional[int] = None,
                            max_seq_len: Optional[int] = None) -> torch.Tensor:
    """Twin of ref_layers.attention_with_prologue: one launch (plus the split merge) where every
    request has at most one query token (``max_query_len`` 1), the same bits as the two
    kernels, which run everything else."""
    args = (qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions,
            cos_sin_cache, k_cache, v_cache, slot_mapping)
    if _decode_fusion and max_query_len == 1:
        out = decode_attention(*args, block_tables, query_start_loc, seq_lens, scale, max_seq_len)
        if out is not None:
            return out
    q = attention_prologue(*args)
    return paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                           max_query_len, max_seq_len)


# The whole layer as one persistent kernel (a few rows of a small model), imported when first used.
_fused_layer = False   # a copy of triton_decoder_layer's switch: asked once per layer call


def decoder_layer(*args, **kwargs):
    """kernels.triton_decoder_layer.decoder_layer (see there): (mlp_out, h) or None."""
    from specserve.kernels import triton_decoder_layer

    return triton_decoder_layer.decoder_layer(*args, **kwargs)


def set_fused_layer(flag: bool) -> None:
    global _fused_layer
    from specserve.kernels import triton_decoder_layer

    triton_decoder_layer.set_enabled(flag)
    _fused_layer = bool(flag)


def fused_layer_enabled() -> bool:
    return _fused_layer


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
