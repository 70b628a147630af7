"""Shared inputs and the naive dense oracle for the model-layer kernel tests (no tests here).

``make_paged_case`` builds a ragged batch (prefill chunks, decodes, verifications, empty rows) over
a paged KV cache whose blocks are handed out in random order, with every unused slot filled with
NaN so that a kernel reading outside a request's context is caught. ``dense_attention`` is the
oracle: per request, dense causal attention over the original (un-paged) K/V in float64 with the
absolute positions written out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Mixes used across the tests: (q_lens, seq_lens). q_len 0 = a request with nothing this step.
MIXES = {
    "decode": ([1, 1, 1, 1], [1, 7, 16, 33]),
    "verify": ([5, 5, 3, 1], [5, 21, 40, 17]),
    "prefill": ([12, 30], [12, 45]),
    "mixed": ([0, 1, 17, 5, 0, 23, 1], [4, 9, 17, 38, 0, 50, 64]),
}


@dataclass
class PagedCase:
    q: torch.Tensor                # [N, Hq, D]
    k_cache: torch.Tensor          # [num_blocks, block_size, Hk, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor     # [R, max_blocks] int32
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor         # [R] int32
    k_ctx: list[torch.Tensor]      # per request [seq_len, Hk, D], the un-paged truth
    v_ctx: list[torch.Tensor]
    slot_mapping: torch.Tensor     # [sum seq_lens] int64, where k_ctx rows were written
    scale: float
    max_query_len: int
    max_seq_len: int


def make_paged_case(q_lens: list[int], seq_lens: list[int], num_q_heads: int, num_kv_heads: int,
                    head_dim: int, block_size: int, dtype: torch.dtype, seed: int,
                    pad_rows: int = 0, device: str = "cpu") -> PagedCase:
    """A ragged batch with its K/V already written into a NaN-filled paged cache.

    ``pad_rows`` extra query rows at the end belong to no request (like CUDA-graph padding).
    """
    from specserve.kernels import ref_layers

    gen = torch.Generator().manual_seed(seed)
    num_reqs = len(q_lens)
    blocks_per_req = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_req) + 2
    # unused table entries point at random (other requests') blocks: they must never be read
    tables = torch.randint(0, num_blocks, (num_reqs, max_blocks), generator=gen)
    for r, nb in enumerate(blocks_per_req):
        tables[r, :nb] = torch.tensor(order[:nb], dtype=torch.long)
        order = order[nb:]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    k_ctx = [rnd(s, num_kv_heads, head_dim) for s in seq_lens]
    v_ctx = [rnd(s, num_kv_heads, head_dim) for s in seq_lens]
    slots = [tables[r, torch.arange(s) // block_size] * block_size + torch.arange(s) % block_size
             for r, s in enumerate(seq_lens)]
    slot_mapping = torch.cat(slots).long() if slots else torch.zeros(0, dtype=torch.long)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    ref_layers.write_kv(torch.cat(k_ctx), torch.cat(v_ctx), k_cache, v_cache, slot_mapping)

    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    num_tokens = int(qsl[-1]) + pad_rows
    return PagedCase(
        q=rnd(num_tokens, num_q_heads, head_dim).to(device),
        k_cache=k_cache.to(device), v_cache=v_cache.to(device),
        block_tables=tables.to(torch.int32).to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
        k_ctx=k_ctx, v_ctx=v_ctx, slot_mapping=slot_mapping.to(device),
        scale=head_dim ** -0.5, max_query_len=max(q_lens), max_seq_len=max(seq_lens))


def step_rows(case: PagedCase, q_lens: list[int], seq_lens: list[int],
              pad_rows: int = 0) -> tuple[list[int], list[int]]:
    """This step's rows for a layer test over ``case`` (made with the same q_lens and seq_lens):
    the KV slots and positions of each request's last q_len tokens, then ``pad_rows`` rows of
    CUDA-graph padding (slot -1, position 0)."""
    slots, positions, start = [], [], 0
    for q, s in zip(q_lens, seq_lens):
        slots += case.slot_mapping[start + s - q:start + s].tolist()
        positions += list(range(s - q, s))
        start += s
    return slots + [-1] * pad_rows, positions + [0] * pad_rows


def dense_attention(case: PagedCase) -> torch.Tensor:
    """The oracle: float64 dense causal attention per request over the un-paged K/V -> [N, Hq, D]."""
    q = case.q.cpu().double()
    out = torch.zeros_like(q)
    starts = case.query_start_loc.tolist()
    num_q_heads, num_kv_heads = q.shape[1], case.k_ctx[0].shape[1] if case.k_ctx else 1
    group = num_q_heads // num_kv_heads
    for r, seq_len in enumerate(case.seq_lens.tolist()):
        q_len = starts[r + 1] - starts[r]
        if q_len == 0:
            continue
        k = case.k_ctx[r].double().repeat_interleave(group, dim=1)   # [S, Hq, D]
        v = case.v_ctx[r].double().repeat_interleave(group, dim=1)
        qr = q[starts[r]:starts[r + 1]]                                # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qr, k) * case.scale     # [Hq, q_len, S]
        q_pos = torch.arange(seq_len - q_len, seq_len)
        visible = torch.arange(seq_len)[None, :] <= q_pos[:, None]    # [q_len, S]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[starts[r]:starts[r + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def rotary_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[max_pos, rot_dim] fp32: first half cos, second half sin (Llama frequencies)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


@dataclass
class DecodeStep:
    """One decode step's inputs to the attention prologue + attention: a token per request (and
    padding rows) over a paged cache whose slots for this step hold NaN until written."""
    case: PagedCase
    qkv: torch.Tensor              # [N, (Hq + 2 Hk) D]
    norms: list                    # [q_norm, k_norm] or [None, None]
    positions: torch.Tensor        # [N] int64
    slots: torch.Tensor            # [N] int64, -1: write nothing
    rope: torch.Tensor             # [max_pos, rot_dim] fp32

    def prologue_args(self, num_q_heads: int, num_kv_heads: int, head_dim: int) -> tuple:
        return (self.qkv, num_q_heads, num_kv_heads, head_dim, *self.norms, 1e-6, self.positions,
                self.rope)

    def meta(self) -> tuple:
        c = self.case
        return c.block_tables, c.query_start_loc, c.seq_lens, c.scale


def decode_step(seq_lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int,
                block_size: int, dtype: torch.dtype, seed: int, qk_norm: bool, rot_dim: int,
                pad_rows: int = 0, idle_rows: tuple = (), device: str = "cpu") -> DecodeStep:
    """A :class:`DecodeStep` for requests of ``seq_lens`` (each ending with this step's token);
    rows in ``idle_rows`` get slot -1 (an idle draft row: attends, writes no K/V)."""
    q_lens = [1] * len(seq_lens)
    case = make_paged_case(q_lens, seq_lens, num_q_heads, num_kv_heads, head_dim, block_size,
                           dtype, seed, pad_rows=pad_rows)
    slots, positions = step_rows(case, q_lens, seq_lens, pad_rows)
    for r in idle_rows:
        slots[r] = -1
    for s in slots:                      # attention must read what the prologue writes
        if s >= 0:
            case.k_cache.view(-1, num_kv_heads, head_dim)[s] = float("nan")
            case.v_cache.view(-1, num_kv_heads, head_dim)[s] = float("nan")
    gen = torch.Generator().manual_seed(seed + 1)
    qkv = (torch.randn(len(slots), (num_q_heads + 2 * num_kv_heads) * head_dim, generator=gen)
           * 2).to(dtype)
    norms = ([(1 + 0.2 * torch.randn(head_dim, generator=gen)).to(dtype).to(device)
              for _ in range(2)] if qk_norm else [None, None])
    to = dict(device=device)
    for f in ("k_cache", "v_cache", "block_tables", "query_start_loc", "seq_lens", "slot_mapping"):
        setattr(case, f, getattr(case, f).to(device))
    return DecodeStep(case, qkv.to(**to), norms, torch.tensor(positions, **to),
                      torch.tensor(slots, **to), rotary_cache(max(seq_lens) + 8, rot_dim).to(**to))
