"""A matmul for few rows: ``y = x @ W.T (+ b)`` at memory bandwidth when x has 1..8 rows.

At decode batch sizes every linear layer of the model is a matrix-vector product: its time is the
time to stream the weight once. cuBLAS picks tensor-core tiles (64 x 8 on Hopper) whose launch
shape leaves the small draft-model layers far from the bandwidth roofline. This kernel reads
each weight tile once, accumulating in fp32:

* program ``(n, s)`` owns ``BLOCK_N`` output columns for all ``M`` rows and the ``s``-th of
  ``SPLIT_K`` slices of K; it streams ``[BLOCK_N, BLOCK_K]`` weight tiles with contiguous loads
  along K (the nn.Linear layout, ``W[N, K]`` row-major) and ``[BLOCK_M, BLOCK_K]`` tiles of x,
  ``num_stages`` tiles in flight (Triton's software pipelining of the K loop);
* ``mode`` says how a tile's products are summed: ``"late"`` accumulates them in a
  ``[BLOCK_M, BLOCK_N, BLOCK_K]`` register tile and sums over K once at the end (no cross-lane
  reduction per step; best at one row), ``"step"`` sums each tile over K into a
  ``[BLOCK_M, BLOCK_N]`` accumulator, ``"dot"`` hands the tile to the tensor cores as
  ``W_tile @ x_tile.T`` with x padded to 16 rows (for several rows the CUDA-core FMAs, M per
  weight element, cost more than the bytes);
* ``SPLIT_K == 1`` adds the bias and stores in x's dtype; ``SPLIT_K > 1`` stores fp32 partial
  sums ``[SPLIT_K, M, N]`` and a second small kernel adds them in slice order (0, 1, ...), adds
  the bias and rounds once. No atomics: the result is the same bit for bit on every run;
* ``SILU_MUL`` (:func:`silu_mul_linear`, the MLP's down projection): x is not read from memory
  but formed per tile from the two halves of ``gate_up [M, 2K]`` as ``silu(gate) * up``, rounded
  by :func:`silu_mul` exactly as the separate silu_and_mul kernel rounds it, so the fused launch
  equals ``linear(silu_and_mul(gate_up))`` bit for bit and saves that kernel and its round trip;
* ``NORM`` (:func:`add_rms_norm_linear`, the projections after a layer's two RMSNorms): x is
  formed per tile as ``h = x + residual`` (rounded to the dtype exactly as the add_rms_norm
  kernel rounds it; the program of column block 0 stores h as the new residual), the product
  is taken with ``h * g`` (g the norm weight) and each row's result is scaled once at the end by
  ``rsqrt(mean(h^2) + eps)``, whose sum of squares accumulates in the same K loop. Every program
  reads the whole row anyway (no split K), so the norm costs no pass of its own and saves the
  norm kernel; unlike SILU_MUL it is not bit for bit the two ops: the normalised row is never
  rounded to the dtype (it agrees with them to the dtype's rounding; in ``"dot"`` mode h * g is
  rounded to the dtype for the tensor cores, so fp16, whose range h * g may pass, is declined
  there).

Launch shapes come from :func:`gemv_config` (an explicit table by (M, N, K), no autotuning: the
kernel runs inside CUDA graph capture, where nothing may be benchmarked or read back). The table
is the H100's unless the GPU's name picks one of :data:`DEVICE_TABLES`, or ``SPECSERVE_GEMV_TABLE``
names a bench/gemv.py result to use instead. Nothing
here reads a device value on the host.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from specserve.kernels import triton_pdl
from specserve.kernels.interpreter import interpreting
from specserve.kernels.jit_keys import settle_cache_keys
from specserve.kernels.triton_pdl import after_producer

MAX_ROWS = 8          # more rows than this: torch.nn.functional.linear (cuBLAS)
MODES = ("late", "step", "dot")

__all__ = ["MAX_ROWS", "GemvConfig", "gemv_config", "linear", "silu_mul_linear", "silu_mul",
           "add_rms_norm_linear",
           "enabled", "set_enabled"]

# The policy switch the Triton backend's ``linear`` asks (kernels/triton_layers.py): on unless
# the engine was started with --no-gemv (engine/setup.py calls ops.set_gemv; every linear is
# then cuBLAS, as before the kernel).
_enabled = True


def enabled() -> bool:
    """Whether the Triton backend routes few-row linears to this kernel. One switch per
    process, like the kernel backend itself: every engine in it shares the setting."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn the kernel on or off for later calls (graphs already captured keep what they had)."""
    global _enabled
    _enabled = bool(flag)


@dataclass(frozen=True)
class GemvConfig:
    """One launch shape. ``split_k`` slices of K are reduced by a second kernel when > 1."""

    block_n: int = 16
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1
    mode: str = "late"

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GemvConfig.{name}={v}: must be a power of two")
        if self.mode not in MODES:
            raise ValueError(f"GemvConfig.mode={self.mode!r}: expected one of {MODES}")
        if self.mode == "dot" and min(self.block_n, self.block_k) < 16:
            raise ValueError("GemvConfig: mode 'dot' needs block_n and block_k >= 16")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"GemvConfig: split_k={self.split_k}, num_stages={self.num_stages}")

    @property
    def label(self) -> str:
        return (f"n{self.block_n}k{self.block_k}s{self.split_k}w{self.num_warps}"
                f"p{self.num_stages}{self.mode}")


# (M rows rounded up to 1, 2, 4 or 8, N, K) -> launch shape, or None: cuBLAS is faster there.
# Shapes not named here get _default_config. bench/gemv.py's report ends with a table in this
# form (the best config per cell, timed on the GPU it ran on) ready to paste. These entries: the
# best config per cell of two H100 runs (2026-11-25; the 0.6B shapes from --grid wide), speedup
# over cuBLAS in the comment; every cell is on, even the one within noise of cuBLAS.
# Shapes: Qwen3-0.6B (N or K 1024), Llama-3-8B and Qwen3-8B (hidden 4096).
CONFIG_TABLE: dict[tuple[int, int, int], Optional[GemvConfig]] = {
    (1, 1024, 2048): GemvConfig(4, 512, 1, 4, 4, "late"),  # o 1.49x
    (2, 1024, 2048): GemvConfig(4, 512, 1, 4, 4, "late"),  # o 1.43x
    (4, 1024, 2048): GemvConfig(4, 512, 1, 4, 4, "late"),  # o 1.31x
    (8, 1024, 2048): GemvConfig(64, 256, 1, 4, 4, "dot"),  # o 1.01x
    (1, 1024, 3072): GemvConfig(4, 512, 1, 4, 4, "late"),  # down 1.66x
    (2, 1024, 3072): GemvConfig(4, 512, 1, 4, 4, "late"),  # down 1.61x
    (4, 1024, 3072): GemvConfig(4, 512, 1, 4, 4, "late"),  # down 1.50x
    (8, 1024, 3072): GemvConfig(64, 256, 4, 4, 4, "dot"),  # down 1.18x
    (1, 4096, 1024): GemvConfig(8, 256, 1, 4, 4, "late"),  # qkv 0.97x
    (2, 4096, 1024): GemvConfig(64, 256, 1, 4, 4, "dot"),  # qkv 1.05x
    (4, 4096, 1024): GemvConfig(64, 256, 1, 4, 4, "dot"),  # qkv 1.03x
    (8, 4096, 1024): GemvConfig(64, 256, 1, 4, 4, "dot"),  # qkv 1.06x
    (1, 4096, 4096): GemvConfig(8, 512, 1, 4, 3, "late"),  # o 1.20x
    (2, 4096, 4096): GemvConfig(8, 512, 1, 4, 3, "late"),  # o 1.15x
    (4, 4096, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # o 1.08x
    (8, 4096, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # o 1.09x
    (1, 4096, 12288): GemvConfig(8, 512, 1, 4, 3, "late"),  # down 1.10x
    (2, 4096, 12288): GemvConfig(8, 512, 1, 4, 3, "late"),  # down 1.08x
    (4, 4096, 12288): GemvConfig(64, 128, 4, 4, 4, "dot"),  # down 1.04x
    (8, 4096, 12288): GemvConfig(64, 128, 4, 4, 4, "dot"),  # down 1.04x
    (1, 4096, 14336): GemvConfig(8, 512, 1, 4, 3, "late"),  # down 1.08x
    (2, 4096, 14336): GemvConfig(8, 512, 1, 4, 3, "late"),  # down 1.07x
    (4, 4096, 14336): GemvConfig(64, 128, 4, 4, 4, "dot"),  # down 1.03x
    (8, 4096, 14336): GemvConfig(64, 128, 4, 4, 4, "dot"),  # down 1.03x
    (1, 6144, 1024): GemvConfig(4, 256, 1, 4, 3, "late"),  # gate_up 1.03x
    (2, 6144, 1024): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.11x
    (4, 6144, 1024): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.08x
    (8, 6144, 1024): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.08x
    (1, 6144, 4096): GemvConfig(8, 512, 1, 4, 3, "late"),  # qkv 1.05x
    (2, 6144, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # qkv 1.06x
    (4, 6144, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # qkv 1.07x
    (8, 6144, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # qkv 1.06x
    (1, 24576, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # gate_up 1.06x
    (2, 24576, 4096): GemvConfig(8, 512, 1, 4, 3, "late"),  # gate_up 1.06x
    (4, 24576, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.04x
    (8, 24576, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.04x
    (1, 28672, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # gate_up 1.05x
    (2, 28672, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # gate_up 1.04x
    (4, 28672, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.03x
    (8, 28672, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # gate_up 1.03x
    (1, 128256, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # lm_head 1.10x
    (2, 128256, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # lm_head 1.10x
    (4, 128256, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.09x
    (8, 128256, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.08x
    (1, 151936, 1024): GemvConfig(4, 512, 1, 4, 3, "late"),  # lm_head 1.10x
    (2, 151936, 1024): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.09x
    (4, 151936, 1024): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.09x
    (8, 151936, 1024): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.08x
    (1, 151936, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # lm_head 1.09x
    (2, 151936, 4096): GemvConfig(4, 512, 1, 4, 3, "late"),  # lm_head 1.09x
    (4, 151936, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.07x
    (8, 151936, 4096): GemvConfig(64, 128, 1, 4, 4, "dot"),  # lm_head 1.07x
}


# (N, K) of the projections where the NORM prologue at one row beat the norm kernel + GEMV on an
# H100 at the plain GEMV's launch shape (scripts/norm_gemv_ab.py, 2026-11-26,
# docs/bench-h100/norm-prologue: fused / two ops = 0.95 Qwen3-8B qkv, 0.99 gate_up, 0.85
# Qwen3-0.6B qkv, 1.00 Llama-3-8B gate_up). At one row of the 0.6B gate_up (N = 6144, K = 1024)
# it was 1.12x slower at that shape; it is fused only where NORM_ONE_ROW gives it a shape of its
# own. At 2-8 rows the prologue was 1.1-1.6x slower on the tensor-core tiles of the 8B qkv, the 8B
# gate_up (from 4 rows) and the 0.6B gate_up, 0.96-0.98x on the 0.6B qkv; fused at every row
# count, the 8B + 0.6B speculative step went from 11.87 to 12.23 ms.
NORM_PROLOGUE_SHAPES: frozenset[tuple[int, int]] = frozenset(
    {(6144, 4096), (24576, 4096), (28672, 4096), (4096, 1024)})

# The fused launch's own shape at one row, by GPU name, where the plain GEMV's would be slower:
# each of its programs normalises the whole row first, so wider column blocks (fewer programs)
# pay more than they do for a plain linear. A shape here is fused at one row on that GPU even
# where NORM_PROLOGUE_SHAPES does not name it. From `python scripts/norm_gemv_ab.py --sweep N,K`
# on an H100 (2026-11-27, docs/bench-h100/norm-sweep; fused / the two kernels, 36 calls per
# graph): the Qwen3-0.6B gate_up 5.18 / 6.51 us (0.80) and qkv 4.11 / 4.97 us (0.83; 4.58 at the
# plain entry). Other GPUs keep the plain shapes (a SPECSERVE_GEMV_TABLE file changes plain shapes only).
NORM_ONE_ROW: dict[str, dict[tuple[int, int], GemvConfig]] = {
    "H100": {
        (6144, 1024): GemvConfig(16, 256, 1, 4, 3, "late"),
        (4096, 1024): GemvConfig(16, 256, 1, 4, 3, "late"),
    },
}


def _row_bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()


def _default_config(m: int, n: int, k: int) -> GemvConfig:
    """A shape-only guess for shapes the table does not name (from the H100 sweeps): one row, and
    up to 4 rows of a narrow weight, on the CUDA cores with narrow column blocks and long K
    tiles; more rows on the tensor cores. K is split when the column blocks alone would leave
    an H100's 132 SMs idle."""
    if m == 1 or (m <= 4 and n <= 2048):
        cfg = GemvConfig(block_n=4, block_k=512, num_stages=4, mode="late")
    else:
        cfg = GemvConfig(block_n=64, block_k=128, num_stages=4, mode="dot")
    blocks, split = triton.cdiv(n, cfg.block_n), 1
    while blocks * split < 132 and k // (split * 2) >= 4 * cfg.block_k:
        split *= 2
    return GemvConfig(cfg.block_n, cfg.block_k, split, cfg.num_warps, cfg.num_stages, cfg.mode)


# One row on an H200 (H200_ONE_ROW): the best config per cell of `python -m specserve.bench.gemv
# --ms 1 --grid wide` on an H200, 2026-11-27 (docs/bench-h200/gemv-table), speedup over cuBLAS
# in the comment. An H200 has as many SMs and as much L2 as an H100 and ~1.4x its copy bandwidth
# (4.2 against 3.0 TB/s). With it the Qwen3-8B-like batch-1 step went from 4.68 to 4.38 ms in
# one call (76.5% -> 81.6% of the roofline in the bench). The sweep times plain linears; their
# gains add up to ~0.09 ms of that step. Most of the rest likely comes from its gate_up going to
# cuBLAS, which also unfuses that layer's RMSNorm prologue (NORM_PROLOGUE_SHAPES): not isolated
# yet. 2-8 rows keep the H100's entries.
H200_ONE_ROW: dict[tuple[int, int, int], Optional[GemvConfig]] = {
    (1, 1024, 2048): GemvConfig(4, 512, 1, 4, 4, "late"),  # 0.6B o, 3.51x
    (1, 1024, 3072): GemvConfig(4, 512, 1, 4, 4, "late"),  # 0.6B down, 1.77x
    (1, 4096, 1024): GemvConfig(8, 256, 1, 4, 3, "late"),  # 0.6B qkv, 1.09x
    (1, 4096, 4096): GemvConfig(8, 512, 1, 4, 3, "late"),  # 8B o, 1.24x
    (1, 4096, 12288): GemvConfig(8, 512, 1, 4, 3, "late"),  # Qwen3-8B down, 1.20x
    (1, 4096, 14336): GemvConfig(16, 512, 1, 4, 3, "late"),  # Llama-3-8B down, 1.08x
    (1, 6144, 1024): None,  # 0.6B gate_up, 1.00x
    (1, 6144, 4096): GemvConfig(16, 256, 1, 4, 4, "late"),  # 8B qkv, 1.03x
    (1, 24576, 4096): None,  # Qwen3-8B gate_up, 0.98x
    (1, 28672, 4096): GemvConfig(8, 512, 1, 4, 3, "late"),  # Llama-3-8B gate_up, 1.06x
    (1, 128256, 4096): GemvConfig(16, 256, 1, 4, 4, "late"),  # Llama-3-8B lm_head, 1.04x
    (1, 151936, 1024): GemvConfig(16, 512, 1, 4, 3, "late"),  # 0.6B lm_head, 1.04x
    (1, 151936, 4096): GemvConfig(16, 256, 1, 4, 4, "late"),  # Qwen3-8B lm_head, 1.05x
}

# Tables of other GPUs, by a key found in the device's name ("H200" also matches a GH200, whose
# HBM3e parts have H200-class bandwidth). A GPU without a table of its own uses CONFIG_TABLE
# (tuned on an H100).
DEVICE_TABLES: dict[str, dict[tuple[int, int, int], Optional[GemvConfig]]] = {
    "H200": {**CONFIG_TABLE, **H200_ONE_ROW},
}

# A gemv.json written by ``python -m specserve.bench.gemv``: its best config per shape replaces
# the table's for every GPU in the process (tuning a new GPU; an A/B in one device call).
TABLE_ENV = "SPECSERVE_GEMV_TABLE"


def table_from_cells(cells: list[dict]) -> dict[tuple[int, int, int], Optional[GemvConfig]]:
    """The launch-shape table of bench/gemv.py's cells: the best config per (rows bucket, N, K),
    None where no config beat cuBLAS (the first cell of a bucket decides, as in its report)."""
    table: dict[tuple[int, int, int], Optional[GemvConfig]] = {}
    for c in sorted(cells, key=lambda c: (c["N"], c["K"], c["M"])):
        key = (_row_bucket(c["M"]), c["N"], c["K"])
        if key in table:
            continue
        b = c.get("best_config")
        won = b is not None and (c.get("best_speedup") or 0.0) >= 1.0
        table[key] = GemvConfig(**b) if won else None
    return table


def _table_of(device_name: str, override: Optional[str]) -> dict:
    """The table for a device name (and an override file, if any); :func:`device_table`
    keeps what it returns."""
    table = CONFIG_TABLE
    for key, own in DEVICE_TABLES.items():
        if key in device_name:
            table = own
            break
    if override:
        with open(override) as f:
            table = {**table, **table_from_cells(json.load(f)["cells"])}
    return table


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device.index if device.index is not None
                                      else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def device_table(device: Optional[torch.device] = None
                 ) -> dict[tuple[int, int, int], Optional[GemvConfig]]:
    """The launch-shape table for ``device`` (None: CONFIG_TABLE's device, the H100), with the
    :data:`TABLE_ENV` file's entries over it when that variable is set. Looked up once per
    device (every linear asks: an environment read per call cost ~2 us of host time);
    :func:`clear_table_cache` forgets the lookups."""
    name = "" if device is None else _device_name(device)
    return _table_of(name, os.environ.get(TABLE_ENV) or None)


def clear_table_cache() -> None:
    """Look the tables up again (after DEVICE_TABLES or the TABLE_ENV variable changed)."""
    device_table.cache_clear()
    norm_table.cache_clear()


def _norm_config(m: int, n: int, k: int, device: torch.device) -> Optional[GemvConfig]:
    """The fused add + RMSNorm launch's shape: this GPU's :data:`NORM_ONE_ROW` entry at one row,
    else the plain GEMV's (:func:`gemv_config`)."""
    own = norm_table(device).get((n, k)) if m == 1 else None
    return own if own is not None else gemv_config(m, n, k, device)


@functools.lru_cache(maxsize=None)
def norm_table(device: torch.device) -> dict[tuple[int, int], GemvConfig]:
    """This GPU's :data:`NORM_ONE_ROW` table (empty for other devices), looked up once per device."""
    name = _device_name(device)
    return next((t for key, t in NORM_ONE_ROW.items() if key in name), {})


def gemv_config(m: int, n: int, k: int,
                device: Optional[torch.device] = None) -> Optional[GemvConfig]:
    """The launch shape for x [m, k] @ W[n, k].T on ``device`` (:func:`device_table`), or None
    where cuBLAS is the better choice."""
    if m < 1 or m > MAX_ROWS:
        return None
    key = (_row_bucket(m), n, k)
    table = device_table(device)
    if key in table:
        return table[key]
    return _default_config(m, n, k)


@triton.jit
def silu_mul(gate, up):
    """silu(gate) * up in gate's dtype: silu in fp32 rounded to the dtype (like torch's F.silu),
    then the product in fp32 rounded again. The one definition of the activation's rounding:
    triton_layers' silu_and_mul kernel and the fused GEMV prologue both call it."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _load_x(x_base, kk, mask, K, SILU_MUL: tl.constexpr):
    """One [BM, BK] tile of x: read, or (SILU_MUL) formed from gate = columns kk and up =
    columns K + kk of the gate_up rows. Masked lanes are 0 either way (silu(0) * 0 = 0)."""
    if SILU_MUL:
        gate = tl.load(x_base + kk[None, :], mask=mask, other=0.0)
        up = tl.load(x_base + K + kk[None, :], mask=mask, other=0.0)
        return silu_mul(gate, up)
    return tl.load(x_base + kk[None, :], mask=mask, other=0.0)


@triton.jit
def _norm_x(x_base, r_base, ro_base, g_ptr, kk, mask, K, store_h, HAS_RES: tl.constexpr):
    """One [BM, BK] tile of the NORM prologue: h = x (+ residual, rounded like the dtype's add;
    stored to the new residual where ``store_h``) -> (h * g in fp32, h in fp32)."""
    x = tl.load(x_base + kk[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_base + kk[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(ro_base + kk[None, :], x, mask=mask & store_h)
    g = tl.load(g_ptr + kk, mask=kk < K, other=0.0)
    h = x.to(tl.float32)
    return h * g.to(tl.float32)[None, :], h


@triton.jit
def _accumulate(acc, ss, x_base, w_base, m_ok, kk, K, EVEN_K: tl.constexpr, MODE: tl.constexpr,
                PRECISION: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr,
                HAS_RES: tl.constexpr, r_base, ro_base, g_ptr, store_h):
    """Add one K tile's products to ``acc`` ([BN, BM] for "dot", [BM, BN, BK] for "late",
    [BM, BN] for "step") and, with NORM, the squares of its h to ``ss`` ([BM, BK])."""
    if EVEN_K:
        w = tl.load(w_base + kk[None, :])                                          # [BN, BK]
        x_ok = m_ok
    else:
        k_ok = kk[None, :] < K       # a slice's tiles past K load nothing
        w = tl.load(w_base + kk[None, :], mask=k_ok, other=0.0)
        x_ok = m_ok & k_ok
    if NORM:
        xg, h = _norm_x(x_base, r_base, ro_base, g_ptr, kk, x_ok, K, store_h, HAS_RES)
        ss += h * h
        if MODE == "dot":
            x = xg.to(w.dtype)
        else:
            x = xg
    else:
        x = _load_x(x_base, kk, x_ok, K, SILU_MUL)                                 # [BM, BK]
    if MODE == "dot":
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)              # [BN, BM]
    else:
        prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]         # [BM, BN, BK]
        if MODE == "late":
            acc += prod
        else:
            acc += tl.sum(prod, axis=2)
    return acc, ss


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, k_per_split,
                 stride_xm, stride_wn, stride_om, stride_os,
                 r_ptr, ro_ptr, g_ptr, eps, stride_rm, stride_rom,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                 MODE: tl.constexpr, PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr,
                 WHILE_LOOP: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr,
                 HAS_RES: tl.constexpr, PDL: tl.constexpr = False):
    """out[s, m, n] (fp32 partials, SPLIT_K > 1) or out[m, n] (+ bias, x's dtype) for this
    program's BLOCK_N columns and its slice [s * k_per_split, (s + 1) * k_per_split) of K.
    ``EVEN_K``: every slice is whole tiles inside K (no masks along K). ``SILU_MUL``: x_ptr is
    gate_up [M, 2K] and each x tile is silu(gate) * up (see :func:`silu_mul`). ``NORM`` (with
    SPLIT_K == 1): x is RMS-normalised with weight g_ptr, after adding r_ptr's residual rows
    when ``HAS_RES`` (column block 0 stores the sum to ro_ptr). ``PDL``: launched ahead of the
    kernel before it (kernels/triton_pdl.py)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n.to(tl.int64) * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # columns past N re-read the last row (always in bounds, never stored): no mask along N
    rows = tl.minimum(offs_n, N - 1 - n0)
    w_base = w_ptr + n0 * stride_wn + rows[:, None] * stride_wn        # [BLOCK_N, 1]
    x_base = x_ptr + offs_m[:, None] * stride_xm                        # [BLOCK_M, 1]
    r_base = r_ptr + offs_m[:, None] * stride_rm
    ro_base = ro_ptr + offs_m[:, None] * stride_rom
    store_h = pid_n == 0
    m_ok = offs_m[:, None] < M
    k_lo = pid_k * k_per_split
    after_producer(PDL)
    if MODE == "dot":
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    elif MODE == "late":
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)      # NORM: sums of h^2 per lane
    if WHILE_LOOP:  # the CPU interpreter cannot run `range` to a runtime bound
        k0 = 0
        while k0 < k_per_split:
            acc, ss = _accumulate(acc, ss, x_base, w_base, m_ok, k_lo + k0 + offs_k, K, EVEN_K,
                                  MODE, PRECISION, SILU_MUL, NORM, HAS_RES, r_base, ro_base,
                                  g_ptr, store_h)
            k0 += BLOCK_K
    else:
        for k0 in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
            acc, ss = _accumulate(acc, ss, x_base, w_base, m_ok, k_lo + k0 + offs_k, K, EVEN_K,
                                  MODE, PRECISION, SILU_MUL, NORM, HAS_RES, r_base, ro_base,
                                  g_ptr, store_h)
    if MODE == "dot":
        acc = tl.trans(acc)                                                        # [BM, BN]
    elif MODE == "late":
        acc = tl.sum(acc, axis=2)                                                  # [BM, BN]
    if NORM:
        acc = acc * tl.rsqrt(tl.sum(ss, axis=1) / K + eps)[:, None]
    cols = n0 + offs_n
    ok = m_ok & (cols[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        dst = out_ptr + offs_m[:, None] * stride_om + cols[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        dst = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + cols[None, :]
        tl.store(dst, acc, mask=ok)


@triton.jit
def _split_reduce_kernel(part_ptr, b_ptr, out_ptr, N, stride_ps, stride_pm, stride_om,
                         HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    """out[m, n] = round(sum_s part[s, m, n] (in order s = 0, 1, ...) + bias[n])."""
    after_producer(PDL)
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    src = part_ptr + m * stride_pm + cols
    acc = tl.load(src, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(src + s * stride_ps, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _launchable(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                width: int) -> bool:
    """Whether the kernel can read x (last dim ``width``: K, or 2K for gate_up) and the weight."""
    return (x.dim() >= 1 and weight.dim() == 2 and weight.stride(1) == 1
            and x.shape[-1] == width and x.dtype == weight.dtype
            and (bias is None or (bias.dim() == 1 and bias.stride(0) == 1
                                  and bias.shape[0] == weight.shape[0]
                                  and bias.dtype == weight.dtype and bias.device == weight.device))
            and x.device == weight.device)


def _takes(cfg: Optional[GemvConfig], m: int, k: int) -> bool:
    """Whether a launch shape runs m rows of depth k (tl.dot needs K tiles of >= 16)."""
    return cfg is not None and 1 <= m <= MAX_ROWS and not (cfg.mode == "dot" and k < 16)


# Shared memory the pipelined tiles may take: an H100 has 227 KiB per block, and Triton keeps
# num_stages - 1 weight + x tiles there (an fp32 model at a bf16-tuned "dot" config asked for
# 240 KiB = 3 x 80 KiB on the H100 and failed to launch).
_STAGE_BYTES = 160 * 1024


def _stages_that_fit(cfg: GemvConfig, block_m: int, elt: int, x_tiles: int = 1) -> int:
    """cfg.num_stages, fewer where num_stages - 1 weight + x tiles would pass _STAGE_BYTES (the
    table is tuned in bf16; an fp32 model gets the same tiles with fewer stages). ``x_tiles``:
    x tiles per stage (2 for gate and up). Stages change no result, only the pipelining."""
    per_stage = (cfg.block_n + x_tiles * block_m) * cfg.block_k * elt
    return max(1, min(cfg.num_stages, _STAGE_BYTES // per_stage + 1))


def _rows(x: torch.Tensor, m: int) -> torch.Tensor:
    """x as [m, width] with a unit stride along the row (a copy only when it has none)."""
    x2 = x.reshape(m, x.shape[-1])
    return x2 if x2.stride(1) == 1 else x2.contiguous()


def _launch(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
            cfg: GemvConfig, silu_mul: bool, norm: Optional[tuple] = None) -> torch.Tensor:
    """The GEMV (and its split-K reduction) on x2 [M, K] (or gate_up [M, 2K] when ``silu_mul``)
    -> [M, N] in x2's dtype. ``norm`` = (residual [M, K] or None, new residual [M, K], norm
    weight [K], eps): the NORM prologue, in one slice of K."""
    m = x2.shape[0]
    n, k = weight.shape
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)                  # [M, N]
    block_m = max(triton.next_power_of_2(m), 16 if cfg.mode == "dot" else 1)   # dot: >= 16
    x_tiles = 2 if silu_mul or (norm is not None and norm[0] is not None) else 1
    stages = _stages_that_fit(cfg, block_m, x2.element_size(), x_tiles)
    block_k = min(cfg.block_k, triton.next_power_of_2(k))
    split = 1 if norm is not None else max(1, min(cfg.split_k, triton.cdiv(k, block_k)))
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k           # whole tiles
    split = triton.cdiv(k, k_per_split)
    grid = (triton.cdiv(n, cfg.block_n), split)
    b = bias if bias is not None else weight
    dst = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x2.device)
    res, res_out, g, eps = norm if norm is not None else (None, x2, weight, 0.0)
    res = res if res is not None else x2
    pdl = triton_pdl.active(x2, "gemv")
    _gemv_kernel[grid](x2, weight, b, dst, m, n, k, k_per_split, x2.stride(0), weight.stride(0),
                       dst.stride(-2), dst.stride(0) if split > 1 else 0,
                       res, res_out, g, eps, res.stride(0), res_out.stride(0),
                       HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
                       BLOCK_K=block_k, SPLIT_K=split, EVEN_K=k_per_split * split == k,
                       MODE=cfg.mode, PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",
                       NUM_STAGES=stages, WHILE_LOOP=interpreting(), SILU_MUL=silu_mul,
                       NORM=norm is not None, HAS_RES=norm is not None and norm[0] is not None,
                       PDL=pdl,
                       num_warps=cfg.num_warps, **triton_pdl.launch_options(pdl))
    if split > 1:
        block = min(1024, triton.next_power_of_2(n))
        _split_reduce_kernel[(m, triton.cdiv(n, block))](
            dst, b, out, n, dst.stride(0), dst.stride(1), out.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK=block, PDL=pdl, num_warps=4,
            **triton_pdl.launch_options(pdl))
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           config: Optional[GemvConfig] = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N] in x.dtype, fp32 accumulation.

    Runs the GEMV kernel for 1..MAX_ROWS rows with ``config`` (default: :func:`gemv_config`);
    anything else (more rows, a shape the table gives to cuBLAS, mixed dtypes, a weight without
    unit stride along K) goes to ``torch.nn.functional.linear``.
    """
    n, k = weight.shape
    m = x.numel() // k if k else 0
    cfg = config if config is not None else gemv_config(m, n, k, weight.device)
    if not _takes(cfg, m, k) or not _launchable(x, weight, bias, k):
        return F.linear(x, weight, bias)
    return _launch(_rows(x, m), weight, bias, cfg, silu_mul=False).reshape(*x.shape[:-1], n)


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                    config: Optional[GemvConfig] = None) -> Optional[torch.Tensor]:
    """``linear(silu_and_mul(gate_up), weight, bias)`` in one launch, or None where the kernel
    does not take the call (the caller then runs the two ops apart).

    gate_up [..., 2K] (gate = first K columns, up = last K), weight [N, K] -> [..., N]. The
    launch shape is the one :func:`linear` would use for the product alone (``config``, default
    :func:`gemv_config` of (M, N, K)), and each x tile is rounded like triton_layers'
    silu_and_mul output: the result equals the unfused Triton path bit for bit. None for rows
    outside 1..MAX_ROWS, a shape the table gives to cuBLAS, mixed dtypes or devices, a last dim
    other than 2K, a weight without unit stride along K.
    """
    n, k = weight.shape
    m = gate_up.numel() // (2 * k) if k else 0
    cfg = config if config is not None else gemv_config(m, n, k, weight.device)
    if not _takes(cfg, m, k) or not _launchable(gate_up, weight, bias, 2 * k):
        return None
    return _launch(_rows(gate_up, m), weight, bias, cfg, silu_mul=True).reshape(
        *gate_up.shape[:-1], n)


def add_rms_norm_linear(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor,
                        eps: float, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                        config: Optional[GemvConfig] = None
                        ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(linear(rms_norm(h, norm_weight, eps), weight, bias), h)`` with h = x + residual (or x
    when residual is None) in one launch, or None where the kernel does not take the call (the
    caller then runs add_rms_norm and linear apart).

    x, residual [..., K], norm_weight [K], weight [N, K] -> ([..., N], h [..., K]). h equals the
    add_rms_norm kernel's new residual bit for bit; the product differs from the two ops only in
    that the normalised row is not rounded to the dtype before it (module docstring, NORM). The
    launch shape is ``config``, default this GPU's :data:`NORM_ONE_ROW` entry, else :func:`linear`'s
    for (M, N, K), always in one slice of K. None without ``config`` except for one row of a shape
    in :data:`NORM_PROLOGUE_SHAPES` or this GPU's NORM_ONE_ROW (where it measured faster), and for
    rows outside 1..MAX_ROWS, a shape the table gives to
    cuBLAS, mixed dtypes or devices, operands without a unit stride along K, fp16 in "dot" mode.
    """
    n, k = weight.shape
    m = x.numel() // k if k else 0
    if config is None and (m != 1 or ((n, k) not in NORM_PROLOGUE_SHAPES
                                      and (n, k) not in norm_table(weight.device))):
        return None                      # the two ops are faster there (NORM_PROLOGUE_SHAPES)
    cfg = config if config is not None else _norm_config(m, n, k, weight.device)
    if (not _takes(cfg, m, k) or not _launchable(x, weight, bias, k)
            or (residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                          or residual.device != x.device))
            or norm_weight.shape != (k,) or norm_weight.stride(0) != 1
            or norm_weight.dtype != x.dtype or norm_weight.device != x.device
            or (cfg.mode == "dot" and x.dtype == torch.float16)):   # h * g may pass fp16's range
        return None
    x2 = _rows(x, m)
    res2 = _rows(residual, m) if residual is not None else None
    new_res = torch.empty_like(x2) if residual is not None else x2
    y = _launch(x2, weight, bias, cfg, silu_mul=False, norm=(res2, new_res, norm_weight, eps))
    return y.reshape(*x.shape[:-1], n), new_res.reshape(x.shape)


settle_cache_keys(globals())   # kernels/jit_keys.py: the same keys in every process
