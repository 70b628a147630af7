"""Probe kernels that write the sampling kernels' random numbers out, for comparison with the
torch Philox (kernels/philox.py). Shared by the interpreter tests (test_triton_sampling.py) and
the GPU tests (tests/gpu/test_sampling_gpu.py); import it only where Triton kernels may be built
(under TRITON_INTERPRET=1 on the CPU, or on a GPU)."""

from __future__ import annotations

import triton
import triton.language as tl

from specserve.kernels import sampling_triton_kernels as K


@triton.jit
def uniform_kernel(seed_ptr, pos_ptr, out_ptr, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """out[row, stream, :V] = U(seed, pos, stream, i) for i < V, one index per lane."""
    row = tl.program_id(0)
    stream = tl.program_id(1)
    offs = tl.arange(0, BLOCK_V)
    u = K._uniform(tl.load(seed_ptr + row), tl.load(pos_ptr + row), stream, offs)
    tl.store(out_ptr + (row * 4 + stream) * V + offs, u, mask=offs < V)


@triton.jit
def uniform_tile_kernel(seed_ptr, pos_ptr, out_ptr, V: tl.constexpr, BLOCK: tl.constexpr):
    """The same through the races' tile generator (four indices per Philox call), tile by tile."""
    row = tl.program_id(0)
    stream = tl.program_id(1)
    seed, pos = tl.load(seed_ptr + row), tl.load(pos_ptr + row)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        u = K._uniform_tile(seed, pos, stream, start, BLOCK)
        tl.store(out_ptr + (row * 4 + stream) * V + offs, u, mask=offs < V)


@triton.jit
def uniform52_kernel(seed_ptr, pos_ptr, out_ptr):
    """out[row, stream] = uniform52(seed, pos, stream): the inverse-CDF draw's fp64 number."""
    row = tl.program_id(0)
    stream = tl.program_id(1)
    u = K._uniform52(tl.load(seed_ptr + row), tl.load(pos_ptr + row), stream)
    tl.store(out_ptr + row * 4 + stream, u)
