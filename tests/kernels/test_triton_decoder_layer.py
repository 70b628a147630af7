"""The fused decoder layer against the layer run op by op, under the CPU interpreter, and its
compilation for an H100.

The interpreter cases live in tests/kernels/_triton_decoder_layer_interp.py and run here in a
subprocess (TRITON_INTERPRET=1 has to be set before Triton kernel modules are imported).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.interpreter import run_interpreter_suite
from tests.helpers.sm90 import H100_SMEM, compile_for_h100

INTERP_TESTS = Path(__file__).with_name("_triton_decoder_layer_interp.py")


def test_interpreter_suite() -> None:
    pytest.importorskip("triton")
    print(run_interpreter_suite(INTERP_TESTS, timeout=540))


@pytest.mark.parametrize("rows,splits,multi", [(1, 8, False), (2, 1, True)])
def test_the_fused_layer_compiles_for_an_h100(rows: int, splits: int, multi: bool) -> None:
    """Through Triton's CUDA pipeline to a cubin (bundled ptxas) at a Qwen3-0.6B-like layer:
    the interpreter cannot see GPU code generation (loop-carried types, layouts, registers)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("compiles for the GPU; not under the interpreter")

    from specserve.kernels import triton_decoder_layer

    fn = triton_decoder_layer._decoder_layer_kernel
    const = dict(H=1024, HP=1024, NQKV=4096, QO=2048, QOP=2048, I=3072, IP=4096, HAS_RES=True,
                 QKV_BIAS=False, O_BIAS=False, GU_BIAS=False, D_BIAS=False, BM=rows,
                 NUM_Q_HEADS=16, NUM_KV_HEADS=8, HAS_NORM=True, HEAD_DIM=128, D_PAD=128, HALF=64,
                 HALF_PAD=64, TAIL=0, TAIL_PAD=1, BLOCK_SIZE=16, GROUP=2,
                 GROUP_PAD=2, ATT_D_PAD=128, BLOCK_Q=8, BLOCK_N=64, NUM_SPLITS=splits,
                 PRECISION=None, WHILE_LOOP=False, BN_QKV=16, BN_O=4, BN_GU=8, BN_D=4,
                 MULTI_QKV=multi, MULTI_O=multi, MULTI_GU=True, MULTI_D=multi)
    typed = {"pos_ptr": "*i64", "slot_ptr": "*i64", "block_tables_ptr": "*i32",
             "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "cos_sin_ptr": "*fp32",
             "ws_acc": "*fp32", "ws_ml": "*fp32", "bar_ptr": "*i32"}
    kernel = compile_for_h100(fn, const, "bf16", typed, triton_decoder_layer.NUM_WARPS)
    assert 0 < kernel.metadata.shared <= H100_SMEM
