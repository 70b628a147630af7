"""Tensor-parallel building blocks: each rank holds a slice of a weight and one collective
restores the full result.

* :class:`ColumnParallelLinear` splits the output features: no communication; packed layers
  (q/k/v, gate/up) hold the rank's slice of every part, concatenated in the part order.
* :class:`RowParallelLinear` splits the input features: partial sums, one all-reduce, then bias.
* :class:`VocabParallelEmbedding` splits the vocabulary rows: each rank looks up the ids it owns
  (zeros elsewhere), one all-reduce. The LM head reuses the same row split: local logits
  [M, V / tp], one all-gather -> [M, V] on every rank.

Weights reach their slice through ``param.weight_loader(param, full_tensor, part)``, called by
the per-parameter loader (engine/models/loader.py) with the checkpoint's full tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from specserve.engine.distributed.group import TPGroup
from specserve.engine.models.llama import Linear
from specserve.kernels import ops


@dataclass(frozen=True)
class Part:
    """One part of a column-parallel weight: rows [start, start + size) of the checkpoint tensor
    go to rows [offset, offset + size) of the local weight."""

    start: int
    size: int
    offset: int


def _copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"{what}: shard of shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src.to(dst.dtype))


class ColumnParallelLinear(nn.Module):
    """y_local = x @ W[rows of this rank].T (+ b): [N, in] -> [N, sum(part sizes)]."""

    def __init__(self, in_features: int, parts: list[Part], bias: bool):
        super().__init__()
        self.parts = parts
        out = sum(p.size for p in parts)
        self.weight = nn.Parameter(torch.empty(out, in_features))
        self.bias = nn.Parameter(torch.empty(out)) if bias else None
        for p in self.parameters():
            p.weight_loader = self._load

    def _load(self, param: nn.Parameter, full: torch.Tensor, part: Optional[int]) -> None:
        p = self.parts[part or 0]
        _copy(param.data[p.offset:p.offset + p.size], full[p.start:p.start + p.size], "column shard")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)

    # the norm is over the full hidden size, which every rank holds whole
    forward_add_rms_norm = Linear.forward_add_rms_norm


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local @ W[:, columns of this rank].T) + b: [N, in / tp] -> [N, out]."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TPGroup):
        super().__init__()
        self.group = group
        self.in_local = in_features // group.world_size
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.weight.weight_loader = self._load_weight
        if self.bias is not None:
            self.bias.weight_loader = lambda param, full, part: _copy(param.data, full, "row bias")

    def _load_weight(self, param: nn.Parameter, full: torch.Tensor, part: Optional[int]) -> None:
        lo = self.group.rank * self.in_local
        _copy(param.data, full[:, lo:lo + self.in_local], "row shard")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(ops.linear(x, self.weight))

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``self(ops.silu_and_mul(gate_up))``: gate_up [N, 2 in / tp] is this rank's gate | up
        slices (ParallelMLP's column split); the local product fuses the activation like
        :meth:`Linear.forward_silu_mul`, then the all-reduce and the bias as in :meth:`forward`."""
        return self._reduce(ops.silu_mul_linear(gate_up, self.weight))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(partial)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [rank * Vp, (rank + 1) * Vp) of the (padded) vocabulary; also the LM head's split."""

    def __init__(self, vocab_size: int, hidden: int, group: TPGroup):
        super().__init__()
        self.group, self.vocab_size = group, vocab_size
        self.per_rank = -(-vocab_size // group.world_size)           # padded to a multiple of tp
        self.lo = group.rank * self.per_rank
        self.weight = nn.Parameter(torch.zeros(self.per_rank, hidden))
        self.weight.weight_loader = self.load_rows

    def load_rows(self, param: nn.Parameter, full: torch.Tensor, part: Optional[int]) -> None:
        rows = full[self.lo:self.lo + self.per_rank]                  # the last rank may be short
        param.data.zero_()
        _copy(param.data[:rows.shape[0]], rows, "vocabulary shard")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [N] -> [N, hidden], identical on every rank."""
        local = ids - self.lo
        mine = (local >= 0) & (local < self.per_rank)
        x = nn.functional.embedding(torch.where(mine, local, 0), self.weight)
        x = x * mine.unsqueeze(-1).to(x.dtype)
        return self.group.all_reduce(x)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """hidden [M, H] and a weight split like this table -> full logits [M, V] on every rank."""
        local = ops.linear(hidden, weight)                            # [M, V / tp]
        return self.group.all_gather_last(local)[:, :self.vocab_size]


def head_split(num_heads: int, num_kv_heads: int, group: TPGroup) -> tuple[int, int, int, int]:
    """(q heads per rank, first q head, kv heads per rank, first kv head) of this rank.

    With fewer KV heads than ranks each KV head is replicated on tp / num_kv_heads ranks: the
    ranks holding query heads of one group hold the same KV head.
    """
    tp, r = group.world_size, group.rank
    if num_heads % tp:
        raise ValueError(f"{num_heads} attention heads do not split over {tp} ranks")
    if num_kv_heads % tp and tp % num_kv_heads:
        raise ValueError(f"{num_kv_heads} KV heads do not split over (nor replicate onto) {tp} ranks")
    hq = num_heads // tp
    if num_kv_heads >= tp:
        hkv = num_kv_heads // tp
        return hq, r * hq, hkv, r * hkv
    return hq, r * hq, 1, r // (tp // num_kv_heads)
