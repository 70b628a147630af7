"""Plain-PyTorch model-layer kernels: the CPU path of the engine and the oracle for the Triton twins.

Every function here has a twin with the same signature in :mod:`kernels.triton_layers`; callers go
through :mod:`kernels.ops`. Rounding follows Hugging Face transformers (Llama / Qwen) so that a
model built on these ops matches ``transformers`` token for token in fp32 and as closely as the
dtype allows in bf16/fp16:

- RMSNorm normalises in fp32, rounds to the input dtype, then multiplies by the weight.
- the residual sum is rounded to the model dtype before it is normalised.
- SiLU-and-mul rounds the activation before the product.
- rotary embeddings are applied in fp32 and rounded once.
- attention softmax and the weighted sum run in fp32, rounded once at the end.

Paged KV cache layout (shared with the Triton kernels and the engine)::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset_in_block

Ragged attention metadata: request ``r`` owns query rows ``query_start_loc[r]:query_start_loc[r+1]``
(``q_len_r`` >= 0) and has ``seq_lens[r]`` tokens of context in the cache, this step's included.
Query ``i`` of request ``r`` sits at position ``seq_lens[r] - q_len_r + i`` and sees positions
``0 ..`` that position. Rows not owned by any request (batch padding) come back as zeros.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F

_NEG_INF = float("-inf")

# Requests with at most this many query tokens (decode, k+1 verification) are attended in one
# padded, batched call; longer ones (prefill chunks) one request at a time.
_BATCHED_MAX_QUERY = 16


class _Memo:
    """The last value built from some small tensors, given again while those tensors hold the
    same values (``torch.equal`` on every call; the memo keeps copies, so a buffer rewritten in
    place in between is seen), ``key`` is equal and ``same`` is the very object it was built
    with (held here, so it cannot be freed and its address reused: a large constant such as the
    rotary table).
    A forward's layers each derive the same thing from the batch's metadata (rotary angles,
    K/V slots); on the CPU each derivation is a handful of small ops of ~5-20 us. Values come
    out bit for bit as a fresh build's.

    ``build`` is called with the memo's own copies of the inputs, so nothing it returns can
    point into a caller's buffer (a buffer rewritten later would change a remembered value).
    The state is one tuple, read once and replaced in one assignment, so two threads sharing
    a memo can only miss, never mix one call's inputs with another's value."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: Optional[tuple] = None   # (input copies, key, same, value)

    def get(self, inputs: tuple, build, key: object = None, same: object = None):
        held = self._held
        if held is not None:
            copies, held_key, held_same, value = held
            if (same is held_same and key == held_key and len(copies) == len(inputs)
                    and all(h.device == t.device and h.dtype == t.dtype and h.shape == t.shape
                            and torch.equal(h, t) for h, t in zip(copies, inputs))):
                return value
        copies = tuple(t.clone() for t in inputs)
        value = build(*copies)
        self._held = (copies, key, same, value)
        return value


_COS_SIN = _Memo()    # positions -> rotary cos / sin
_KV_SLOTS = _Memo()   # slot mapping -> K/V slots written
_PLAN = _Memo()       # batch metadata -> _BatchedPlan


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [M, K], weight: [N, K] (nn.Linear's layout), bias: [N] -> [M, N] in x.dtype."""
    return F.linear(x, weight, bias)


def set_gemv(flag: bool) -> None:
    """The reference has no GEMV: every linear is F.linear either way."""


def set_fused_layer(flag: bool) -> None:
    """The reference has no fused decoder layer: layers run op by op either way."""


def fused_layer_enabled() -> bool:
    return False


def decoder_layer(*args, **kwargs) -> None:
    """No fused layer here (None: the model runs the layer op by op, through these ops, which
    are the twin the Triton backend's fused layer is tested against)."""
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim. x: [N, H], weight: [H] -> [N, H] in x.dtype."""
    x32 = x.float()
    inv = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)  # [N, 1]
    return (weight * (x32 * inv).to(x.dtype)).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """new_residual = x + residual (in x.dtype); returns (rms_norm(new_residual), new_residual)."""
    new_residual = x + residual  # [N, H]
    return rms_norm(new_residual, weight, eps), new_residual


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX/Llama rotary embedding (rotate_half: pairs (i, i + R/2)), applied in place.

    q: [N, Hq, D], k: [N, Hk, D], positions: [N] int64, cos_sin_cache: [max_pos, R] fp32 with
    R <= D (first R/2 columns cos, last R/2 sin); the first R dims of each head are rotated.
    Returns (q, k), the same tensors.
    """
    cos, sin = _cos_sin(positions, cos_sin_cache)
    for t in (q, k):
        _rotate(t, cos, sin)
    return q, k


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate the first 2 x cos.shape[-1] dims of every head of t [N, H, D] in place (fp32,
    rounded once)."""
    rot = 2 * cos.shape[-1]
    x = t[..., :rot].float()                                       # [N, H, R]
    x1, x2 = x.chunk(2, dim=-1)                                    # [N, H, R/2]
    t[..., :rot] = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(t.dtype)


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, 1, R/2] fp32 of ``positions``: the last ones again when the positions and
    the cache are the same (a forward's layers all ask for the same; ``_Memo``)."""
    def build(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos_sin_cache[pos].float().chunk(2, dim=-1)         # [N, R/2] each
        return cos.unsqueeze(1), sin.unsqueeze(1)                      # [N, 1, R/2]
    # (the table is built once per model and never written: its identity stands for its values)
    return _COS_SIN.get((positions,), build, same=cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [N, 2I] -> silu(x[:, :I]) * x[:, I:], [N, I]."""
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The MLP's activation and down projection as one op: linear(silu_and_mul(gate_up), weight,
    bias). gate_up: [M, 2I], weight: [N, I] -> [M, N]."""
    return F.linear(silu_and_mul(gate_up), weight, bias)


def add_rms_norm_linear(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor,
                        eps: float, weight: torch.Tensor,
                        bias: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's RMSNorm and the projection after it as one op: h = x + residual (x when
    residual is None); returns (linear(rms_norm(h, norm_weight, eps), weight, bias), h)."""
    if residual is None:
        h, normed = x, rms_norm(x, norm_weight, eps)
    else:
        normed, h = add_rms_norm(x, residual, norm_weight, eps)
    return F.linear(normed, weight, bias), h


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store token i's K/V at slot_mapping[i]; negative slots (padding) are skipped.

    k, v: [N, Hk, D]; k_cache, v_cache: [num_blocks, block_size, Hk, D]; slot_mapping: [N] int64.
    """
    def build(mapping: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        slots = mapping.long()
        valid = slots >= 0                                               # [N]
        if bool(valid.all()):
            return slots, None
        return slots[valid], valid.nonzero().squeeze(1)
    idx, rows = _KV_SLOTS.get((slot_mapping,), build)
    k_flat = k_cache.view(-1, *k_cache.shape[2:])                        # [num_slots, Hk, D]
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    if rows is not None:
        k, v = k.index_select(0, rows), v.index_select(0, rows)
    k_flat[idx] = k.to(k_cache.dtype)
    v_flat[idx] = v.to(v_cache.dtype)


def attention_prologue(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor], eps: float,
                       positions: torch.Tensor, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """What happens between the QKV projection and attention, as one op.

    qkv: [N, (Hq + 2 Hk) D] (q heads, then k heads, then v heads). Splits it, applies the
    per-head RMSNorm to q and k when ``q_norm`` / ``k_norm`` are given (Qwen3), the rotary
    embedding to both, and stores k and v at ``slot_mapping`` (negative slots skipped).
    Returns q: [N, Hq, D], a contiguous tensor. Without q/k norms and with N = 1 the q and k
    columns of ``qkv`` are contiguous already and are rotated in place (not copied); at other
    N ``qkv`` is not modified.
    """
    n = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    v = v.reshape(n, num_kv_heads, head_dim)
    if q_norm is not None:
        q = rms_norm(q.reshape(-1, head_dim), q_norm, eps).view(n, num_heads, head_dim)
        k = rms_norm(k.reshape(-1, head_dim), k_norm, eps).view(n, num_kv_heads, head_dim)
        apply_rotary(q, k, positions, cos_sin_cache)
    else:   # q and k side by side in qkv: one copy and one rotation of both (the same values)
        qk = qkv[:, :q_size + kv_size].reshape(n, num_heads + num_kv_heads, head_dim).contiguous()
        cos, sin = _cos_sin(positions, cos_sin_cache)
        _rotate(qk, cos, sin)
        q, k = qk[:, :num_heads].contiguous(), qk[:, num_heads:]
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float, max_query_len: Optional[int] = None,
                    max_seq_len: Optional[int] = None) -> torch.Tensor:
    """Causal attention of ragged queries over a paged KV cache (GQA, fp32 softmax).

    q: [N, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hk, D];
    block_tables: [R, max_blocks] int32; query_start_loc: [R+1] int32; seq_lens: [R] int32.
    Returns [N, Hq, D] in q.dtype. max_query_len / max_seq_len are unused here (the reference
    reads the metadata on the host).
    """
    out = torch.zeros_like(q)  # [N, Hq, D]
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    short, long = [], []
    for r, seq_len in enumerate(lens):
        q_len = starts[r + 1] - starts[r]
        if q_len <= 0 or seq_len <= 0:
            continue
        if q_len > seq_len:
            raise ValueError(f"request {r}: {q_len} query tokens but only {seq_len} context tokens")
        (short if q_len <= _BATCHED_MAX_QUERY else long).append(r)
    if short:
        _attend_batched(q, k_cache, v_cache, block_tables, starts, lens, short, scale, out)
    for r in long:
        _attend_one(q, k_cache, v_cache, block_tables[r], starts[r], starts[r + 1], lens[r],
                    scale, out)
    return out


def attention_with_prologue(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                            q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor],
                            eps: float, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            max_query_len: Optional[int] = None,
                            max_seq_len: Optional[int] = None) -> torch.Tensor:
    """:func:`attention_prologue` then :func:`paged_attention` over its q -> [N, Hq, D]."""
    q = attention_prologue(qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions,
                           cos_sin_cache, k_cache, v_cache, slot_mapping)
    return paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                           max_query_len, max_seq_len)


def set_decode_fusion(flag: bool) -> None:
    """The reference runs the prologue and attention apart either way."""


def set_pdl(flag: bool) -> None:
    """The reference launches no kernels of its own."""


def pdl_scope(hidden_size: int, rows: Optional[int] = None):
    return contextlib.nullcontext()


def _gather_context(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached tokens of one request. blocks: [>= ceil(length/bs)] -> [length, Hk, D]."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    ctx = cache[blocks[:num_blocks].long()]                  # [nb, bs, Hk, D]
    return ctx.flatten(0, 1)[:length]


def _attend_one(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                blocks: torch.Tensor, q_start: int, q_end: int, seq_len: int, scale: float,
                out: torch.Tensor) -> None:
    """Attention for one request (a prefill chunk); writes out[q_start:q_end]."""
    q_len = q_end - q_start
    qr = q[q_start:q_end].float().transpose(0, 1)                                # [Hq, q_len, D]
    kr = _gather_context(k_cache, blocks, seq_len).float().transpose(0, 1)       # [Hk, S, D]
    vr = _gather_context(v_cache, blocks, seq_len).float().transpose(0, 1)       # [Hk, S, D]
    gqa = qr.shape[0] != kr.shape[0]
    if q_len == seq_len:
        o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, scale=scale,
                                           enable_gqa=gqa)
    else:
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)          # [q_len]
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]  # [q_len, S]
        o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale,
                                           enable_gqa=gqa)
    out[q_start:q_end] = o.transpose(0, 1).to(out.dtype)                         # [q_len, Hq, D]


class _BatchedPlan:
    """What :func:`_attend_batched` derives from the batch's metadata alone, the same for every
    layer of a forward: query rows, K/V slots, the causal mask and where outputs go.

    A forward's layers each call the attention with the same metadata. Deriving this again in
    every layer was ~20 small tensor ops, about half of a CPU decode layer's attention time
    (the demo target, 8 layers, batch 1: ~0.5 ms of ~1.2 ms a layer). One plan is kept: the
    last one built. It is reused only when the requests' query starts and context lengths are
    the same values and the block-table entries it read are equal (compared on every call), so
    it is a memo of a pure function (``_Memo``): outputs are bit for bit those of a fresh
    derivation."""

    __slots__ = ("rows", "q_valid", "dense", "dest", "src", "slots", "hidden")

    def __init__(self, tables: torch.Tensor, starts: list[int], lens: list[int],
                 reqs: list[int], block_size: int, num_rows: int) -> None:
        dev = tables.device
        q_lens = [starts[r + 1] - starts[r] for r in reqs]
        max_q = max(q_lens)
        num_blocks = tables.shape[1]
        q_len_t = torch.tensor(q_lens, device=dev)                                  # [B]
        seq_t = torch.tensor([lens[r] for r in reqs], device=dev)                   # [B]
        start_t = torch.tensor([starts[r] for r in reqs], device=dev)               # [B]
        ar_q = torch.arange(max_q, device=dev)
        q_valid = ar_q[None, :] < q_len_t[:, None]                                  # [B, Lq]
        rows = torch.where(q_valid, start_t[:, None] + ar_q[None, :], 0)            # [B, Lq]
        kv_pos = torch.arange(num_blocks * block_size, device=dev)                  # [S']
        kv_valid = kv_pos[None, :] < seq_t[:, None]                                 # [B, S']
        slots = tables.long().repeat_interleave(block_size, dim=1) * block_size + kv_pos % block_size
        # slots past a request's length may hold anything (even NaN) or not exist: read the
        # request's first slot there instead (finite, and masked out below)
        self.slots = torch.where(kv_valid, slots, slots[:, :1])                     # [B, S']
        q_pos = seq_t[:, None] - q_len_t[:, None] + ar_q[None, :]                   # [B, Lq]
        self.hidden = (kv_pos[None, None, :] > q_pos[:, :, None])[:, :, None]      # [B, Lq, 1, S']
        self.rows, self.q_valid = rows, q_valid
        # every query row in order, each request max_q of them: the output is o itself
        self.dense = (len(reqs) * max_q == num_rows
                      and all(starts[r] == i * max_q and n == max_q
                              for i, (r, n) in enumerate(zip(reqs, q_lens))))
        self.dest = rows[q_valid]                                                   # [n] out rows
        self.src = q_valid.flatten().nonzero().squeeze(1)                           # [n] o rows


def _batched_plan(block_tables: torch.Tensor, starts: list[int], lens: list[int],
                  reqs: list[int], block_size: int, num_rows: int) -> _BatchedPlan:
    """The plan for these requests: the last one when its inputs are equal, else a new one."""
    num_blocks = -(-max(lens[r] for r in reqs) // block_size)
    if reqs == list(range(len(reqs))):
        tables = block_tables[:len(reqs), :num_blocks]                              # (a view)
    else:
        tables = block_tables[torch.tensor(reqs, device=block_tables.device), :num_blocks]
    return _PLAN.get((tables,), lambda held: _BatchedPlan(held, starts, lens, reqs, block_size,
                                                          num_rows),
                     key=(tuple(starts), tuple(lens), tuple(reqs), block_size, num_rows))


def _attend_batched(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, starts: list[int], lens: list[int],
                    reqs: list[int], scale: float, out: torch.Tensor) -> None:
    """Attention for many short-query requests (decode / verification) in one padded call."""
    plan = _batched_plan(block_tables, starts, lens, reqs, k_cache.shape[1], q.shape[0])
    batch, max_q = plan.rows.shape
    kb = k_cache.view(-1, *k_cache.shape[2:])[plan.slots].float()                   # [B, S', Hk, D]
    vb = v_cache.view(-1, *v_cache.shape[2:])[plan.slots].float()
    num_kv_heads = kb.shape[2]
    group = q.shape[1] // num_kv_heads
    qf = q.float() if plan.dense else q[plan.rows].float()
    qb = qf.view(batch, max_q, num_kv_heads, group, -1)                             # [B, Lq, Hk, g, D]
    outs = []
    for h in range(num_kv_heads):  # per KV head: bmm reads the strided K/V without a copy
        qh = qb[:, :, h].flatten(1, 2)                                              # [B, Lq*g, D]
        scores = torch.bmm(qh, kb[:, :, h].transpose(1, 2)) * scale                 # [B, Lq*g, S']
        scores = scores.view(batch, max_q, group, -1).masked_fill_(plan.hidden, _NEG_INF)
        probs = scores.softmax(dim=-1).flatten(1, 2)                                # [B, Lq*g, S']
        outs.append(torch.bmm(probs, vb[:, :, h]).view(batch, max_q, group, -1))
    o = torch.stack(outs, dim=2).flatten(0, 1).flatten(1, 2)                        # [B*Lq, Hq, D]
    if plan.dense:
        out.copy_(o)
    else:
        out.index_copy_(0, plan.dest, o.index_select(0, plan.src).to(out.dtype))
