"""The GEMV kernel (kernels/triton_gemv.py) under the CPU interpreter vs torch.nn.functional.linear
(run by test_triton_gemv.py in a subprocess with TRITON_INTERPRET=1, like _triton_layers_interp.py).

Shapes are small and odd (N and K not multiples of any block) so that every mask and the
clamped last column block are exercised. Tolerances: fp32 1e-5 (both accumulate in fp32, in a
different order; outputs are O(1)); fp16 2e-3 against the fp32 product of the same fp16 inputs
(the kernel rounds once, at the end: |error| <= 2^-11 of an O(1) output plus fp32 noise).
bf16 is not tested against torch here (the interpreter's bf16 arithmetic is unreliable); the GPU
bench checks it. The fused SiLU-and-mul prologue (silu_mul_linear) is compared with the unfused
Triton path bit for bit, in fp32, bf16 and fp16: both paths run the same interpreter arithmetic,
so any difference is a difference in the kernels' maths.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 set before triton is imported", allow_module_level=True)

from specserve.kernels import triton_gemv as G  # noqa: E402

N, K = 37, 100          # odd on purpose: 3 column blocks of 16 (the last one short), K % 32 = 4


def _inputs(m: int, n: int, k: int, bias: bool, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed * 100 + m)
    x = torch.randn(m, k, generator=gen).to(dtype)                         # [M, K]
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)            # [N, K]
    b = torch.randn(n, generator=gen).to(dtype) if bias else None          # [N]
    return x, w, b


@pytest.mark.parametrize("m", range(1, G.MAX_ROWS + 1))
@pytest.mark.parametrize("split", [1, 3])
def test_fp32_matches_f_linear(m: int, split: int) -> None:
    """Every row count 1..8; split-K off and on (3 slices of 32: the last one partly past K);
    bias on for odd M, off for even M; the three modes take turns with M."""
    cfg = G.GemvConfig(block_n=16, block_k=32, split_k=split, mode=G.MODES[m % 3])
    x, w, b = _inputs(m, N, K, bias=m % 2 == 1, seed=split)
    got = G.linear(x, w, b, config=cfg)
    assert got.shape == (m, N) and got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("m,split,mode", [(1, 1, "late"), (5, 2, "step"), (8, 4, "dot"),
                                          (3, 1, "dot")])
def test_fp16_close_to_fp32_product(m: int, split: int, mode: str) -> None:
    cfg = G.GemvConfig(block_n=16, block_k=64, split_k=split, mode=mode)
    x, w, b = _inputs(m, 21, 200, bias=True, dtype=torch.float16, seed=7)
    got = G.linear(x, w, b, config=cfg)
    assert got.dtype == torch.float16
    want = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


def test_default_config_splits_k_for_few_column_blocks_and_is_deterministic() -> None:
    """gemv_config's own choice for a narrow, deep weight splits K; two runs agree bit for bit."""
    m, n, k = 3, 24, 4200
    cfg = G.gemv_config(m, n, k)
    assert cfg is not None and cfg.split_k > 1
    x, w, b = _inputs(m, n, k, bias=True, seed=3)
    first, second = G.linear(x, w, b), G.linear(x, w, b)
    assert torch.equal(first, second)
    torch.testing.assert_close(first, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_more_rows_than_the_limit_or_a_none_config_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b = _inputs(G.MAX_ROWS + 1, N, K, bias=True)
    assert G.gemv_config(G.MAX_ROWS + 1, N, K) is None
    assert torch.equal(G.linear(x, w, b), F.linear(x, w, b))
    monkeypatch.setitem(G.CONFIG_TABLE, (2, N, K), None)         # "cuBLAS is faster here"
    x2 = x[:2]
    assert G.gemv_config(2, N, K) is None
    launched = []
    monkeypatch.setattr(G, "_gemv_kernel", _Spy(launched))
    assert torch.equal(G.linear(x2, w, b), F.linear(x2, w, b)) and not launched


class _Spy:
    """Stands in for the kernel: records a launch (and fails the test if one happens)."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getitem__(self, grid):
        self.calls.append(grid)
        raise AssertionError("the kernel was launched")


def test_through_ops_strided_and_3d_inputs_and_the_switch() -> None:
    """ops.linear on the triton backend: a strided x, a [B, T, K] x, and the --no-gemv switch."""
    from specserve.kernels import backend, ops

    x, w, b = _inputs(4, N, 2 * K, bias=True, seed=5)
    xs = x[:, ::2]                                                 # [4, K], stride 2 along K
    w = w[:, :K].contiguous()
    backend.set_backend("triton")
    try:
        torch.testing.assert_close(ops.linear(xs, w, b), F.linear(xs, w, b), atol=1e-5, rtol=1e-5)
        x3 = xs.reshape(2, 2, K)
        got3 = ops.linear(x3, w)
        assert got3.shape == (2, 2, N)
        torch.testing.assert_close(got3, F.linear(x3, w), atol=1e-5, rtol=1e-5)
        G.set_enabled(False)
        assert torch.equal(ops.linear(xs, w, b), F.linear(xs, w, b))
    finally:
        G.set_enabled(True)
        backend.set_backend("torch")


# --- the MLP's SiLU-and-mul fused into the down projection (silu_mul_linear) ---------------------

def _gate_up(m: int, k: int, dtype, seed: int, pad: int = 0) -> torch.Tensor:
    """[m, 2k] gate | up rows (values around the SiLU's bend); ``pad`` extra columns per row make
    the row stride 2k + pad."""
    gen = torch.Generator().manual_seed(seed * 100 + m)
    full = (2 * torch.randn(m, 2 * k + pad, generator=gen)).to(dtype)
    return full[:, :2 * k]


def _unfused(gate_up, w, b, cfg):
    from specserve.kernels import triton_layers

    return G.linear(triton_layers.silu_and_mul(gate_up), w, b, config=cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("mode", G.MODES)
@pytest.mark.parametrize("split", [1, 4])
def test_silu_mul_linear_equals_the_unfused_path_bit_for_bit(dtype, mode: str, split: int) -> None:
    """Every row count 1..8, with and without bias; K = 100 is not a multiple of the 32-wide K
    tile (split 4: four slices of 32, the last one partly past K); the activation is rounded
    to the dtype before the product, so the fused launch reads the very x the unfused one does."""
    from specserve.kernels import ref_layers

    cfg = G.GemvConfig(block_n=16, block_k=32, split_k=split, mode=mode)
    for m in range(1, G.MAX_ROWS + 1):
        for bias in (False, True):
            gate_up = _gate_up(m, K, dtype, seed=split)
            _, w, b = _inputs(m, N, K, bias=bias, dtype=dtype, seed=split + 1)
            got = G.silu_mul_linear(gate_up, w, b, config=cfg)
            assert got is not None and got.shape == (m, N) and got.dtype == dtype
            want = _unfused(gate_up, w, b, cfg)
            assert torch.equal(got, want), f"M={m} bias={bias}: max diff {(got - want).abs().max()}"
            if dtype == torch.float32:   # and it is the product it claims to be
                torch.testing.assert_close(got, ref_layers.silu_mul_linear(gate_up, w, b),
                                           atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", G.MODES)
def test_silu_mul_linear_even_k_and_strided_rows(mode: str) -> None:
    """K a multiple of the tile (no K masks), gate_up rows with a stride past 2K (a view)."""
    cfg = G.GemvConfig(block_n=16, block_k=32, split_k=2, mode=mode)
    for m in (1, 3, 8):
        gate_up = _gate_up(m, 128, torch.float32, seed=9, pad=6)
        assert gate_up.stride(0) == 2 * 128 + 6
        _, w, b = _inputs(m, N, 128, bias=True, seed=9)
        got = G.silu_mul_linear(gate_up, w, b, config=cfg)
        assert got is not None and torch.equal(got, _unfused(gate_up, w, b, cfg))


def test_silu_mul_linear_uses_the_down_projections_table_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a config it takes gemv_config's choice for (M, N, K) of the product, and still
    equals the unfused path (which takes the same entry)."""
    mine = G.GemvConfig(block_n=8, block_k=64, split_k=2, mode="step")
    monkeypatch.setitem(G.CONFIG_TABLE, (4, N, K), mine)
    gate_up = _gate_up(3, K, torch.float32, seed=4)
    _, w, b = _inputs(3, N, K, bias=True, seed=4)
    got = G.silu_mul_linear(gate_up, w, b)
    assert got is not None and torch.equal(got, _unfused(gate_up, w, b, None))
    assert torch.equal(got, _unfused(gate_up, w, b, mine))


def test_silu_mul_linear_declines_what_the_kernel_does_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """None (the caller runs the two ops) for: more rows than MAX_ROWS, no rows, a table entry
    of None, a last dim other than 2K, mixed dtypes, "dot" at K < 16; no launch in any of them."""
    launched = []
    monkeypatch.setattr(G, "_gemv_kernel", _Spy(launched))
    _, w, b = _inputs(1, N, K, bias=True)
    assert G.silu_mul_linear(_gate_up(G.MAX_ROWS + 1, K, torch.float32, 0), w, b) is None
    assert G.silu_mul_linear(torch.empty(0, 2 * K), w, b) is None
    monkeypatch.setitem(G.CONFIG_TABLE, (2, N, K), None)
    assert G.silu_mul_linear(_gate_up(2, K, torch.float32, 0), w, b) is None
    assert G.silu_mul_linear(torch.randn(2, 2 * K + 1), w, b) is None
    assert G.silu_mul_linear(_gate_up(1, K, torch.float64, 0), w, b) is None
    dot = G.GemvConfig(block_n=16, block_k=16, mode="dot")
    small_w = torch.randn(N, 8)
    assert G.silu_mul_linear(torch.randn(1, 16), small_w, config=dot) is None
    assert not launched


def test_silu_mul_linear_through_ops_fallbacks_and_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """ops.silu_mul_linear on the triton backend: fused for 1..8 rows (a [B, T, 2K] input too),
    the unfused Triton ops for 9 rows, with --no-gemv, and where the table says cuBLAS; always
    equal to ops.linear(ops.silu_and_mul(.)) bit for bit; the torch twin is the reference."""
    from specserve.kernels import backend, ops, ref_layers

    _, w, b = _inputs(1, N, K, bias=True, seed=6)
    backend.set_backend("triton")
    try:
        def unfused(g):
            return ops.linear(ops.silu_and_mul(g), w, b)

        for m in (1, 4, G.MAX_ROWS, G.MAX_ROWS + 1):
            gate_up = _gate_up(m, K, torch.float32, seed=6)
            assert torch.equal(ops.silu_mul_linear(gate_up, w, b), unfused(gate_up)), m
        x3 = _gate_up(4, K, torch.float32, seed=7).reshape(2, 2, 2 * K)
        got3 = ops.silu_mul_linear(x3, w, b)
        assert got3.shape == (2, 2, N)
        assert torch.equal(got3.reshape(4, N), unfused(x3.reshape(4, 2 * K)))

        gate_up = _gate_up(2, K, torch.float32, seed=8)
        fused = ops.silu_mul_linear(gate_up, w, b)
        monkeypatch.setitem(G.CONFIG_TABLE, (2, N, K), None)     # "cuBLAS is faster here"
        assert torch.equal(ops.silu_mul_linear(gate_up, w, b),
                           F.linear(ops.silu_and_mul(gate_up), w, b))
        torch.testing.assert_close(fused, ops.silu_mul_linear(gate_up, w, b), atol=1e-5, rtol=1e-5)
        monkeypatch.delitem(G.CONFIG_TABLE, (2, N, K))
        G.set_enabled(False)
        launched = []
        monkeypatch.setattr(G, "_gemv_kernel", _Spy(launched))
        assert torch.equal(ops.silu_mul_linear(gate_up, w, b),
                           F.linear(ops.silu_and_mul(gate_up), w, b)) and not launched
    finally:
        G.set_enabled(True)
        backend.set_backend("torch")
    torch.testing.assert_close(ops.silu_mul_linear(gate_up, w, b),
                               ref_layers.silu_mul_linear(gate_up, w, b), atol=1e-5, rtol=1e-5)
    assert torch.equal(ref_layers.silu_mul_linear(gate_up, w, b),
                       F.linear(ref_layers.silu_and_mul(gate_up), w, b))


def test_the_models_mlp_runs_fused_and_equals_the_unfused_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine/models/llama.py's MLP on the triton backend: for decode rows its down projection
    is one fused launch (no separate silu_and_mul); at one row of a NORM_PROLOGUE_SHAPES shape
    its norm is inside the gate_up GEMV too (no norm kernel). The output equals
    down_proj(silu_and_mul(gate_up_proj(...))) of the same normed input (the activation bit for
    bit, the fused norm to fp32 rounding); 9 rows run the unfused ops, bit for bit."""
    from types import SimpleNamespace

    from specserve.engine.models.llama import MLP
    from specserve.kernels import backend, ops, triton_layers

    torch.manual_seed(0)
    mlp = MLP(SimpleNamespace(hidden_size=24, intermediate_size=K, mlp_bias=True))
    g = 1 + 0.1 * torch.randn(24)
    monkeypatch.setattr(G, "NORM_PROLOGUE_SHAPES", frozenset({(2 * K, 24)}))   # gate_up
    backend.set_backend("triton")
    try:
        for m in (1, 5, G.MAX_ROWS + 1):   # the norm fused at one row, the activation up to 8
            x, res = torch.randn(m, 24), torch.randn(m, 24)
            normed, h = ops.add_rms_norm(x, res, g, 1e-6)
            want = mlp.down_proj(ops.silu_and_mul(mlp.gate_up_proj(normed)))
            calls = []
            real_act, real_norm = triton_layers.silu_and_mul, triton_layers.add_rms_norm
            monkeypatch.setattr(triton_layers, "silu_and_mul", lambda t: calls.append(t) or real_act(t))
            monkeypatch.setattr(triton_layers, "add_rms_norm",
                                lambda *a: calls.append(a) or real_norm(*a))
            got, new_res = mlp(x, res, g, 1e-6)
            monkeypatch.setattr(triton_layers, "silu_and_mul", real_act)
            monkeypatch.setattr(triton_layers, "add_rms_norm", real_norm)
            assert torch.equal(new_res, h), m
            if m == 1:
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
                assert not calls, m
            elif m <= G.MAX_ROWS:
                assert torch.equal(got, want) and len(calls) == 1, m     # the norm kernel
            else:
                assert torch.equal(got, want) and len(calls) == 2, m
    finally:
        backend.set_backend("torch")


def _norm_inputs(m: int, n: int, k: int, dtype, seed: int):
    gen = torch.Generator().manual_seed(seed * 31 + m)
    x = torch.randn(m, k, generator=gen).to(dtype)
    res = (2 * torch.randn(m, k, generator=gen)).to(dtype)                 # a larger stream
    g = (1 + 0.2 * torch.randn(k, generator=gen)).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    return x, res, g, w, b


@pytest.mark.parametrize("m", range(1, G.MAX_ROWS + 1))
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_linear_fp32_matches_the_two_ops(m: int, with_residual: bool) -> None:
    """Every row count, the three modes taking turns, bias on odd M, with and without a
    residual: the new residual is the add_rms_norm kernel's bit for bit, the product agrees
    with linear(rms_norm(h)) to fp32 rounding. A config with split K runs in one slice."""
    from specserve.kernels import ref_layers

    split = 3 if m % 4 == 0 else 1
    cfg = G.GemvConfig(block_n=16, block_k=32, split_k=split, mode=G.MODES[m % 3])
    x, res, g, w, b = _norm_inputs(m, N, K, torch.float32, seed=int(with_residual))
    b = b if m % 2 else None
    residual = res if with_residual else None
    got, h = G.add_rms_norm_linear(x, residual, g, 1e-6, w, b, config=cfg)
    want, want_h = ref_layers.add_rms_norm_linear(x, residual, g, 1e-6, w, b)
    assert got.shape == (m, N) and h.shape == (m, K)
    assert torch.equal(h, want_h)
    if not with_residual:
        assert h is x or h.data_ptr() == x.data_ptr()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("m,mode", [(1, "late"), (3, "step"), (8, "late")])
def test_add_rms_norm_linear_fp16_close_to_the_fp32_maths(m: int, mode: str) -> None:
    """fp16: h rounded exactly like the two ops' add; the product within 2e-3 of the fp32
    maths on the same h (the two ops round the normed row to fp16 first; the kernel does not)."""
    from specserve.kernels import ref_layers

    cfg = G.GemvConfig(block_n=16, block_k=64, mode=mode)
    x, res, g, w, b = _norm_inputs(m, 21, 200, torch.float16, seed=3)
    got, h = G.add_rms_norm_linear(x, res, g, 1e-6, w, b, config=cfg)
    assert got.dtype == torch.float16 and torch.equal(h, x + res)
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float()
    want = F.linear(normed, w.float(), b.float())
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)
    ref, _ = ref_layers.add_rms_norm_linear(x, res, g, 1e-6, w, b)
    torch.testing.assert_close(got.float(), ref.float(), atol=4e-3, rtol=4e-3)


def test_add_rms_norm_linear_declines_what_the_kernel_does_not_take(monkeypatch) -> None:
    x, res, g, w, b = _norm_inputs(2, N, K, torch.float32, seed=5)
    cfg = G.GemvConfig(block_n=16, block_k=32)
    assert G.add_rms_norm_linear(x, res, g, 1e-6, w, config=cfg) is not None
    big = torch.randn(G.MAX_ROWS + 1, K)
    assert G.add_rms_norm_linear(big, None, g, 1e-6, w, config=cfg) is None  # too many rows
    assert G.add_rms_norm_linear(x, res.half(), g, 1e-6, w, config=cfg) is None   # mixed dtypes
    assert G.add_rms_norm_linear(x, res[:1], g, 1e-6, w, config=cfg) is None      # shapes
    assert G.add_rms_norm_linear(x, res, g[:-1], 1e-6, w, config=cfg) is None     # norm size
    dot = G.GemvConfig(block_n=16, block_k=32, mode="dot")      # h * g may pass fp16's range
    assert G.add_rms_norm_linear(x.half(), res.half(), g.half(), 1e-6, w.half(), config=dot) is None
    assert G.add_rms_norm_linear(x, res, g, 1e-6, w, config=dot) is not None
    # without a config: one row of a shape in NORM_PROLOGUE_SHAPES only
    assert G.add_rms_norm_linear(x, res, g, 1e-6, w) is None
    assert G.add_rms_norm_linear(x[:1], res[:1], g, 1e-6, w) is None
    monkeypatch.setattr(G, "NORM_PROLOGUE_SHAPES", frozenset({(N, K)}))
    assert G.add_rms_norm_linear(x[:1], res[:1], g, 1e-6, w) is not None
    assert G.add_rms_norm_linear(x, res, g, 1e-6, w) is None
