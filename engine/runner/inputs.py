"""Flattening a ragged batch of token runs into the tensors one forward pass needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.engine.models.llama import AttentionMetadata
from specserve.engine.runner.transfer import to_device


@dataclass
class ForwardItem:
    """One request's run of tokens in a forward pass."""

    token_ids: list[int]      # tokens to process this pass
    start: int                # absolute position of token_ids[0]
    block_ids: list[int]      # the request's block table
    num_logits: int           # trailing positions whose logits are needed (0 = none)


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor        # [num_tokens] int64
    positions: torch.Tensor        # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor   # [num_logit_rows] int64, rows of the hidden states to project


@dataclass
class FlatBatch:
    """A ragged batch flattened on the host: one entry per token, or per request."""

    ids: list[int]
    positions: list[int]
    slots: list[int]          # KV slot of each token
    qsl: list[int]            # query start of each request, and the end
    seq_lens: list[int]       # context of each request once this pass is written
    logit_rows: list[int]     # token rows whose logits are wanted


def flatten(items: list[ForwardItem], block_size: int) -> FlatBatch:
    flat = FlatBatch([], [], [], [0], [], [])
    for it in items:
        n = len(it.token_ids)
        base = len(flat.ids)
        flat.ids.extend(it.token_ids)
        p = range(it.start, it.start + n)
        flat.positions.extend(p)
        blocks = it.block_ids
        flat.slots.extend(blocks[q // block_size] * block_size + q % block_size for q in p)
        flat.qsl.append(flat.qsl[-1] + n)
        flat.seq_lens.append(it.start + n)
        flat.logit_rows.extend(range(base + n - it.num_logits, base + n))
    return flat


def build_inputs(items: list[ForwardItem], block_size: int, device: torch.device,
                 max_seq_len_bound: int | None = None) -> ForwardInputs:
    """``max_seq_len_bound`` (the model's context limit) replaces the batch's own longest context
    as the attention kernel's launch bound, so eager steps launch exactly the kernels a CUDA graph
    captured with that bound does (and round identically)."""
    flat = flatten(items, block_size)
    max_blocks = max((len(it.block_ids) for it in items), default=1) or 1
    tables = [it.block_ids + [0] * (max_blocks - len(it.block_ids)) for it in items]

    def t(x, dtype):
        return to_device(x, dtype, device)

    meta = AttentionMetadata(
        slot_mapping=t(flat.slots, torch.int64),
        block_tables=t(tables, torch.int32),
        query_start_loc=t(flat.qsl, torch.int32),
        seq_lens=t(flat.seq_lens, torch.int32),
        max_query_len=max((len(it.token_ids) for it in items), default=0),
        max_seq_len=max_seq_len_bound or max(flat.seq_lens, default=0),
    )
    return ForwardInputs(t(flat.ids, torch.int64), t(flat.positions, torch.int64), meta,
                         t(flat.logit_rows, torch.int64))
