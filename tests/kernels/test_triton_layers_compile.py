"""The Triton layer kernels compile for an H100 (sm_90) on a machine without a GPU.

The interpreter tests check what the kernels compute; they cannot see GPU code generation
(loop-carried types, dot shapes, shared memory). Here each kernel goes through Triton's real
CUDA pipeline down to a cubin with the ptxas bundled in the Triton wheel, at the configurations
``paged_attention`` picks for decode, verification and prefill, and the attention tiles must fit
in an H100's 227 KiB of shared memory per block.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles for the GPU; not under the interpreter", allow_module_level=True)

from tests.helpers.sm90 import H100_SMEM, compile_for_h100, pdl_ordered  # noqa: E402

INT_PTRS = {"block_tables_ptr": "*i32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
            "slot_ptr": "*i64", "pos_ptr": "*i64", "cache_ptr": "*fp32",
            "ws_acc_ptr": "*fp32", "ws_ml_ptr": "*fp32"}


def _compile(fn, dtype: str, constexprs: dict, num_warps: int = 4) -> int:
    """Compile ``fn`` for sm_90 with every other pointer of ``dtype``; returns the shared memory used."""
    return compile_for_h100(fn, constexprs, dtype, INT_PTRS, num_warps).metadata.shared


@pytest.mark.parametrize("dtype,rows,block_n,splits,warps", [
    ("bf16", 16, 64, 1, 4),     # decode: 4 tokens x 4 heads of a GQA group
    ("bf16", 16, 64, 8, 4),     # decode, split-KV
    ("fp16", 64, 64, 1, 4),     # verification / short chunks
    ("bf16", 128, 64, 1, 8),    # long prefill
    ("fp32", 64, 32, 1, 4),     # fp32 model (IEEE dots)
])
def test_paged_attention_compiles(dtype: str, rows: int, block_n: int, splits: int, warps: int) -> None:
    from specserve.kernels import triton_attention

    pdl = splits > 1 or dtype == "fp16"    # (kernels/triton_pdl.py) both ways
    consts = dict(NUM_Q_HEADS=32, GROUP=4, GROUP_PAD=4, HEAD_DIM=128, D_PAD=128, BLOCK_SIZE=16,
                  BLOCK_Q=rows // 4, BLOCK_N=block_n, NUM_SPLITS=splits,
                  PRECISION="ieee" if dtype == "fp32" else None, WHILE_LOOP=False, PDL=pdl)
    kernel = compile_for_h100(triton_attention._paged_attention_kernel, consts, dtype, INT_PTRS,
                              warps)
    assert 0 < kernel.metadata.shared <= H100_SMEM
    assert pdl_ordered(kernel.asm["ptx"]) == pdl
    if splits > 1:
        _compile(triton_attention._merge_splits_kernel, dtype,
                 dict(NUM_Q_HEADS=32, HEAD_DIM=128, D_PAD=128, NUM_SPLITS=splits))


def test_elementwise_kernels_compile() -> None:
    from specserve.kernels import triton_layers as tl_

    _compile(tl_._rms_norm_kernel, "bf16", dict(HAS_RESIDUAL=True, BLOCK_H=4096), 8)
    norm = compile_for_h100(tl_._rms_norm_kernel, dict(HAS_RESIDUAL=True, BLOCK_H=1024, PDL=True),
                            "bf16", INT_PTRS, 4)
    assert pdl_ordered(norm.asm["ptx"])
    _compile(tl_._rms_norm_kernel, "fp32", dict(HAS_RESIDUAL=False, BLOCK_H=128), 1)
    _compile(tl_._rotary_kernel, "bf16", dict(HALF=64, HALF_PAD=64, QH_PAD=32, KH_PAD=8))
    _compile(tl_._silu_and_mul_kernel, "bf16", dict(BLOCK=1024))
    _compile(tl_._write_kv_kernel, "bf16", dict(HEAD_DIM=128, BLOCK_SIZE=16, HEADS_PAD=8, D_PAD=128))
    for has_norm, tail in ((True, 0), (False, 64)):   # Qwen3 (full rotary), partial rotary
        prologue = compile_for_h100(tl_._attention_prologue_kernel,
                                    {**_prologue_consts(has_norm, tail), "PDL": has_norm}, "bf16",
                                    INT_PTRS)
        assert pdl_ordered(prologue.asm["ptx"]) == has_norm


def _prologue_consts(has_norm: bool, tail: int) -> dict:
    """An 8B-like layer's prologue: 32 query heads, 8 KV heads of 128."""
    from specserve.kernels import triton_prologue

    return triton_prologue.constexprs(32, 8, 128, 128 - tail, has_norm, 16)


@pytest.mark.parametrize("splits,has_norm,tail", [(1, True, 0), (8, True, 0), (4, False, 64)])
def test_decode_attention_compiles(splits: int, has_norm: bool, tail: int) -> None:
    """The one-token attention with its prologue inside (triton_decode_attention), at the
    decode tile the attention kernel uses (4 heads of a GQA group, rows of 16)."""
    from specserve.kernels import triton_decode_attention

    from specserve.kernels import triton_attention

    pdl = splits > 1    # launched ahead of the kernel before (kernels/triton_pdl.py) or not
    consts = dict(_prologue_consts(has_norm, tail), ATT_D_PAD=128, BLOCK_Q=4, BLOCK_N=64,
                  NUM_SPLITS=splits, PRECISION=None, WHILE_LOOP=False, PDL=pdl)
    kernel = compile_for_h100(triton_decode_attention._decode_attention_kernel, consts, "bf16",
                              INT_PTRS, 4)
    assert 0 < kernel.metadata.shared <= H100_SMEM
    assert pdl_ordered(kernel.asm["ptx"]) == pdl
    for merge_pdl in (False, True):
        merge = compile_for_h100(triton_attention._merge_splits_kernel,
                                 dict(NUM_Q_HEADS=32, HEAD_DIM=128, D_PAD=128, NUM_SPLITS=8,
                                      PDL=merge_pdl), "bf16", INT_PTRS)
        assert pdl_ordered(merge.asm["ptx"]) == merge_pdl


def test_attention_does_not_specialise_on_the_request_mix() -> None:
    """The request count, token count and block-table width change with every batch; a Triton
    specialisation on them (1 / multiple of 16 / neither) is a variant the start-up warm-up may
    never meet, compiled under load while every running request waits (0.4-0.8 s on an H100)."""
    from specserve.kernels import triton_attention

    def free(kernel) -> set:
        return {p.name for p in kernel.params if p.do_not_specialize}

    assert {"num_reqs", "num_tokens", "stride_bt"} <= free(triton_attention._paged_attention_kernel)
    assert {"num_reqs", "num_tokens"} <= free(triton_attention._merge_splits_kernel)
