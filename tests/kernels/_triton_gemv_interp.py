"""The GEMV kernel (kernels/triton_gemv.py) under the CPU interpreter vs torch.nn.functional.linear
(run by test_triton_gemv.py in a subprocess with TRITON_INTERPRET=1, like _triton_layers_interp.py).

Shapes are small and odd (N and K not multiples of any block) so that every mask and the
clamped last column block are exercised. Tolerances: fp32 1e-5 (both accumulate in fp32, in a
different order; outputs are O(1)); fp16 2e-3 against the fp32 product of the same fp16 inputs
(the kernel rounds once, at the end: |error| <= 2^-11 of an O(1) output plus fp32 noise).
bf16 is not tested here (the interpreter's bf16 arithmetic is unreliable); the GPU bench checks it.
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
