"""The GEMV kernel (kernels/triton_gemv.py): its interpreter suite, its policy, its GPU code.

* the cases of tests/kernels/_triton_gemv_interp.py run in a subprocess with TRITON_INTERPRET=1
  (it must be set before Triton kernel modules are imported and must not leak into this process);
* ``--no-gemv`` (EngineConfig.gemv) turns the kernel off, the config table caps the rows and
  obeys its entries, a GPU with a table of its own gets it, a bench/gemv.py sweep can replace it;
* the kernels compile for an H100 (sm_90) with Triton's bundled ptxas at the bench's launch
  shapes: the interpreter cannot see GPU code generation (layouts of the 3-D product, registers).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.interpreter import REPO, run_interpreter_suite
from tests.helpers.sm90 import pdl_ordered

triton = pytest.importorskip("triton")

INTERP_TESTS = Path(__file__).with_name("_triton_gemv_interp.py")


def test_interpreter_suite() -> None:
    print(run_interpreter_suite(INTERP_TESTS, timeout=300))


def test_the_no_gemv_flag_reaches_the_kernel_switch() -> None:
    """``specserve serve --no-gemv`` -> EngineConfig.gemv = False -> ops.set_gemv on the
    selected backend (engine/setup.py); the torch reference accepts and ignores it."""
    from specserve.kernels import backend, ops, triton_gemv
    from specserve.server.cli import build_parser, engine_config

    parser = build_parser()
    assert engine_config(parser.parse_args(["serve"])).gemv is True
    assert engine_config(parser.parse_args(["serve", "--no-gemv"])).gemv is False
    from specserve.kernels import triton_layers

    try:                                      # the triton backend's switch (engine/setup.py calls
        triton_layers.set_gemv(False)         # it through ops.set_gemv on the selected backend)
        assert not triton_gemv.enabled()
    finally:
        triton_layers.set_gemv(True)
    assert triton_gemv.enabled()
    assert backend.selected().name == "torch"
    ops.set_gemv(False)                       # the reference backend: a no-op
    assert triton_gemv.enabled()


def test_the_engine_applies_the_flag_before_building_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine/setup.py hands EngineConfig.gemv to ops.set_gemv (demo pair on CPU)."""
    from specserve.engine import setup
    from specserve.engine.config import DEMO_MODEL, EngineConfig

    seen = []
    monkeypatch.setattr(setup.ops, "set_gemv", seen.append)
    setup.load_models(EngineConfig(model=DEMO_MODEL, device="cpu", gemv=False))
    assert seen == [False]


def test_config_table_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    from specserve.kernels import triton_gemv as G

    assert G.gemv_config(0, 64, 64) is None and G.gemv_config(G.MAX_ROWS + 1, 64, 64) is None
    for m in range(1, G.MAX_ROWS + 1):          # every shape is on until the table says otherwise
        assert G.gemv_config(m, 1024, 2048) is not None
    mine = G.GemvConfig(block_n=32, block_k=128, split_k=2, num_warps=8)
    monkeypatch.setitem(G.CONFIG_TABLE, (4, 1024, 2048), mine)
    monkeypatch.setitem(G.CONFIG_TABLE, (8, 1024, 2048), None)
    assert G.gemv_config(3, 1024, 2048) is mine            # 3 rows use the 4-row entry
    assert G.gemv_config(5, 1024, 2048) is None and G.gemv_config(8, 1024, 2048) is None
    for bad in (dict(block_n=24), dict(mode="fast"), dict(mode="dot", block_n=8)):
        with pytest.raises(ValueError):
            G.GemvConfig(**bad)


@pytest.fixture
def fresh_tables(monkeypatch: pytest.MonkeyPatch):
    """No SPECSERVE_GEMV_TABLE, and the table lookups forgotten before and after the test."""
    from specserve.kernels import triton_gemv as G

    monkeypatch.delenv(G.TABLE_ENV, raising=False)
    G.clear_table_cache()
    yield G
    G.clear_table_cache()


def test_tables_per_gpu_and_from_a_gemv_sweep(fresh_tables, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path) -> None:
    """A GPU whose name holds a DEVICE_TABLES key gets that table, any other the H100's; a
    gemv.json of bench/gemv.py named by SPECSERVE_GEMV_TABLE lays its best configs over it
    (None where cuBLAS won), and shapes it does not name keep the table's entry."""
    import json

    G = fresh_tables
    own = {(1, 1024, 2048): G.GemvConfig(block_n=8, block_k=256, num_stages=5)}
    monkeypatch.setattr(G, "DEVICE_TABLES", {"H200": own})
    assert G._table_of("NVIDIA H200", None) is own
    assert G._table_of("NVIDIA H100 80GB HBM3", None) is G.CONFIG_TABLE
    assert G.device_table(torch.device("cpu")) is G.CONFIG_TABLE
    assert G.gemv_config(1, 1024, 2048) is G.CONFIG_TABLE[(1, 1024, 2048)]

    best = dict(block_n=16, block_k=256, split_k=2, num_warps=4, num_stages=4, mode="late")
    cells = [dict(M=1, N=1024, K=2048, best_config=best, best_speedup=1.3),
             dict(M=2, N=1024, K=2048, best_config=best, best_speedup=1.2),     # bucket 2
             dict(M=8, N=1024, K=2048, best_config=best, best_speedup=0.9)]     # cuBLAS won
    path = tmp_path / "gemv.json"
    path.write_text(json.dumps({"cells": cells}))
    monkeypatch.setenv(G.TABLE_ENV, str(path))
    G.clear_table_cache()
    assert G.gemv_config(1, 1024, 2048) == G.GemvConfig(**best)
    assert G.gemv_config(8, 1024, 2048) is None
    assert G.gemv_config(4, 1024, 2048) is G.CONFIG_TABLE[(4, 1024, 2048)]
    assert G._table_of("NVIDIA H200", str(path))[(1, 1024, 2048)] == G.GemvConfig(**best)


def _record_launches(G, monkeypatch: pytest.MonkeyPatch) -> list:
    """The GEMV launches' configs, recorded instead of run (CPU tests of which shape is asked)."""
    launched = []

    def record(x2, weight, bias, cfg, silu_mul, norm=None):
        launched.append(cfg)
        return torch.zeros(x2.shape[0], weight.shape[0], dtype=x2.dtype)

    monkeypatch.setattr(G, "_launch", record)
    return launched


def test_the_linears_ask_for_their_weights_device_table(fresh_tables,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """linear, silu_mul_linear and add_rms_norm_linear take their launch shape from the table
    of the weight's device: a device named like an H200 whose table sends the shape to cuBLAS
    gets no kernel launch (the launch is recorded, not run: this is a CPU test)."""
    G = fresh_tables
    launched = _record_launches(G, monkeypatch)
    n, k = 4096, 1024                       # in NORM_PROLOGUE_SHAPES: add_rms_norm_linear fuses it
    w, x = torch.randn(n, k), torch.randn(1, k)
    calls = (lambda: G.linear(x, w), lambda: G.silu_mul_linear(torch.randn(1, 2 * k), w),
             lambda: G.add_rms_norm_linear(x, x, torch.ones(k), 1e-6, w))
    for call in calls:
        call()
    assert launched == [G.CONFIG_TABLE[(1, n, k)]] * 3      # the CPU's table: the H100's
    launched.clear()
    monkeypatch.setattr(G, "DEVICE_TABLES", {"H200": {(1, n, k): None}})
    monkeypatch.setattr(G, "_device_name", lambda device: "NVIDIA H200")
    G.clear_table_cache()
    assert isinstance(calls[0](), torch.Tensor) and calls[1]() is None and calls[2]() is None
    assert launched == []                   # cuBLAS (linear) or "not taken" (the fused two)


def test_the_fused_norm_launch_takes_its_own_shape_on_an_h100_only(
        fresh_tables, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row of the 0.6B qkv and gate_up on a GPU named like an H100: the fused add + RMSNorm
    launch at NORM_ONE_ROW's shape (the gate_up fused only there); on another GPU the qkv at the
    plain table's shape and the gate_up not fused (recorded, not run: a CPU test)."""
    G = fresh_tables
    launched = _record_launches(G, monkeypatch)
    name = {"now": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(G, "_device_name", lambda device: name["now"])

    def fused(n: int, k: int):
        x = torch.randn(1, k)
        return G.add_rms_norm_linear(x, x, torch.ones(k), 1e-6, torch.randn(n, k))

    h100 = G.NORM_ONE_ROW["H100"]
    assert fused(6144, 1024) is not None and fused(4096, 1024) is not None
    assert launched == [h100[(6144, 1024)], h100[(4096, 1024)]]
    launched.clear()
    name["now"] = "NVIDIA A100-SXM4-80GB"
    G.clear_table_cache()
    assert fused(6144, 1024) is None and fused(4096, 1024) is not None
    assert launched == [G.CONFIG_TABLE[(1, 4096, 1024)]]


def test_the_h200_table_is_its_recorded_sweep() -> None:
    """DEVICE_TABLES["H200"] is the H100 table with its one-row entries replaced by the sweep
    committed beside the H200 bench (docs/bench-h200/gemv-table/gemv.json), entry for entry."""
    import json

    from specserve.kernels import triton_gemv as G

    cells = json.loads((REPO / "docs/bench-h200/gemv-table/gemv.json").read_text())["cells"]
    swept = G.table_from_cells(cells)
    assert swept == G.H200_ONE_ROW
    assert G.DEVICE_TABLES["H200"] == {**G.CONFIG_TABLE, **swept}
    assert sum(v is None for v in swept.values()) == 2          # cuBLAS won two shapes


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for the GPU")
@pytest.mark.parametrize("block_m,block_n,block_k,split,mode,stages,warps,prologue", [
    (1, 4, 512, 1, "late", 3, 4, None),      # batch 1: the default
    (8, 8, 128, 4, "step", 1, 4, None),      # per-step reduction, split-K partials
    (16, 32, 128, 1, "dot", 4, 4, None),     # 2-8 rows on the tensor cores: the default
    (16, 64, 256, 2, "dot", 3, 8, None),
    (1, 8, 512, 1, "late", 3, 4, "silu"),    # the MLP's down projection with its SiLU prologue
    (16, 64, 128, 4, "dot", 4, 4, "silu"),
    (4, 16, 128, 2, "step", 2, 4, "silu"),
    (1, 4, 512, 1, "late", 3, 4, "norm"),    # qkv / gate_up with the add + RMSNorm prologue
    (16, 64, 128, 1, "dot", 4, 4, "norm"),
    (4, 16, 128, 1, "step", 2, 4, "norm"),
    (1, 8, 512, 1, "late", 3, 4, "norm0"),   # the first layer's norm: no residual
])
def test_kernels_compile_for_sm90(block_m: int, block_n: int, block_k: int, split: int,
                                  mode: str, stages: int, warps: int, prologue) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specserve.kernels import triton_gemv as G

    # programmatic dependent launch (kernels/triton_pdl.py) on every other shape: its
    # grid-dependency instructions must reach the PTX, and be absent when off
    pdl = (block_m + split) % 2 == 0

    def build(fn, consts: dict, ptrs: dict) -> None:
        consts = {**consts, "PDL": pdl}
        sig = {}
        for name in fn.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            else:
                sig[name] = ptrs.get(name, "*bf16") if name.endswith("_ptr") else (
                    "i64" if name.startswith("stride") else "fp32" if name == "eps" else "i32")
        src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        try:
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps, "num_stages": stages})
        except FileNotFoundError as e:  # a Triton build without its bundled ptxas
            pytest.skip(f"no CUDA toolchain in this Triton install: {e}")
        assert pdl_ordered(kernel.asm["ptx"]) == pdl

    out = {"out_ptr": "*fp32" if split > 1 else "*bf16"}
    build(G._gemv_kernel, dict(HAS_BIAS=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                               SPLIT_K=split, EVEN_K=True, MODE=mode, PRECISION="tf32",
                               NUM_STAGES=stages, WHILE_LOOP=False, SILU_MUL=prologue == "silu",
                               NORM=prologue in ("norm", "norm0"), HAS_RES=prologue == "norm"), out)
    if split > 1:
        build(G._split_reduce_kernel, dict(HAS_BIAS=True, SPLIT_K=split, BLOCK=1024),
              {"part_ptr": "*fp32"})
