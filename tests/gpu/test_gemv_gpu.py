"""The GEMV kernel (kernels/triton_gemv.py) on a real GPU, in bf16 and fp32, at model shapes.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_gemv_gpu.py``. Each case compares against
the fp32 product of the same inputs: bf16 within 2^-7 of the output scale (one bf16 rounding at
the end, fp32 sums), fp32 1e-4 (the fp32 modes; "dot" runs in IEEE fp32). Through ops.linear,
inside a CUDA graph, the result equals an eager call bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specserve.bench.timing import capture_graph

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPES = [(4096, 1024), (1024, 2048), (1024, 3072), (6144, 4096), (1000, 1000), (37, 100)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_row_count_and_mode(n: int, k: int, dtype: torch.dtype) -> None:
    from specserve.kernels import triton_gemv as G

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    for m in range(1, G.MAX_ROWS + 1):
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        want = F.linear(x.float(), w.float(), b.float())
        atol = 1e-4 if dtype == torch.float32 else float(want.abs().max()) / 128
        cfgs = [None, G.GemvConfig(4, 512, 1, 4, 3, "late"), G.GemvConfig(64, 128, 3, 4, 4, "dot"),
                G.GemvConfig(16, 128, 2, 4, 1, "step")]
        for cfg in cfgs:
            got = G.linear(x, w, b, config=cfg)
            assert got.dtype == dtype and got.shape == (m, n)
            torch.testing.assert_close(got.float(), want, atol=atol, rtol=0,
                                       msg=lambda s: f"M={m} {cfg}: {s}")


def _assert_graph_replays_equal_eager(call) -> None:
    """``call()`` run eagerly, then warmed up on a side stream, captured in a CUDA graph and
    replayed three times: every replay equals the eager result bit for bit."""
    eager = call()
    graph, out = capture_graph(call)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_ops_linear_in_a_cuda_graph_is_deterministic() -> None:
    from specserve.kernels import backend, ops

    backend.set_backend("triton")
    try:
        w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) / 50
        x = torch.randn(4, 3072, device="cuda", dtype=torch.bfloat16)
        _assert_graph_replays_equal_eager(lambda: ops.linear(x, w))
    finally:
        backend.set_backend("torch")


@pytest.mark.parametrize("n,k", [(1024, 3072), (4096, 12288), (4096, 14336), (37, 100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul_linear_equals_the_unfused_ops_bit_for_bit(n: int, k: int, dtype: torch.dtype) -> None:
    """The MLP's down projection with the SiLU-and-mul prologue (triton_gemv.silu_mul_linear)
    against the unfused Triton path (triton_layers.silu_and_mul, then the GEMV at the same
    config): equal bit for bit on the GPU's own code generation, every row count and mode."""
    from specserve.kernels import triton_gemv as G
    from specserve.kernels import triton_layers

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    cfgs = [None, G.GemvConfig(4, 512, 1, 4, 3, "late"), G.GemvConfig(64, 128, 3, 4, 4, "dot"),
            G.GemvConfig(16, 128, 2, 4, 1, "step")]
    for m in range(1, G.MAX_ROWS + 1):
        gate_up = (2 * torch.randn(m, 2 * k, device="cuda", generator=gen)).to(dtype)
        act = triton_layers.silu_and_mul(gate_up)
        for cfg in cfgs:
            for bias in (None, b):
                got = G.silu_mul_linear(gate_up, w, bias, config=cfg)
                assert got is not None, (m, cfg)
                want = G.linear(act, w, bias, config=cfg)
                assert torch.equal(got, want), f"M={m} {cfg} bias={bias is not None}"


def test_ops_silu_mul_linear_in_a_cuda_graph_is_deterministic() -> None:
    from specserve.kernels import backend, ops

    backend.set_backend("triton")
    try:
        w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) / 50
        gate_up = torch.randn(4, 2 * 3072, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(ops.silu_mul_linear(gate_up, w), ops.linear(ops.silu_and_mul(gate_up), w))
        _assert_graph_replays_equal_eager(lambda: ops.silu_mul_linear(gate_up, w))
    finally:
        backend.set_backend("torch")


@pytest.mark.parametrize("n,k", [(6144, 4096), (24576, 4096), (4096, 1024), (6144, 1024)])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_linear_at_model_shapes(n: int, k: int, m: int, with_residual: bool) -> None:
    """The GEMV's add + RMSNorm prologue in bf16: the new residual equals the add_rms_norm
    kernel's bit for bit, the product is within 2^-7 of the output scale of the fp32 maths on
    the same h (the kernel's config forced at 4 rows, where ops leave it off), and through ops
    inside a CUDA graph it replays what it computes eagerly."""
    from specserve.kernels import backend, ops, triton_gemv, triton_layers

    gen = torch.Generator(device="cuda").manual_seed(n + m)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    res = (2 * torch.randn(m, k, device="cuda", generator=gen)).to(torch.bfloat16)
    g = (1 + 0.2 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    residual = res if with_residual else None
    # this GPU's config for the fused launch (its NORM_ONE_ROW shape at one row, else the plain
    # table's; where that sends the shape to cuBLAS, the shape-only default)
    cfg = triton_gemv._norm_config(m, n, k, w.device) or triton_gemv._default_config(m, n, k)
    y, h = triton_gemv.add_rms_norm_linear(x, residual, g, 1e-6, w, config=cfg)
    want_h = triton_layers.add_rms_norm(x, res, g, 1e-6)[1] if with_residual else x
    assert torch.equal(h, want_h)
    hf = want_h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float()
    want = F.linear(normed, w.float())
    assert (y.float() - want).abs().max().item() <= 2 ** -7 * want.abs().max().item()
    backend.set_backend("triton")
    try:
        _assert_graph_replays_equal_eager(lambda: ops.add_rms_norm_linear(x, residual, g, 1e-6, w)[0])
    finally:
        backend.set_backend("torch")
