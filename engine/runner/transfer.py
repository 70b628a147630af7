"""Host -> device copies that never make the host wait for the GPU.

A copy from ordinary (pageable) host memory is staged by the driver and, in practice, waits for
the work already queued on the stream: every small ``torch.tensor(...).to("cuda")`` after a
forward launch would stall the host until that forward finishes. Staging the values in pinned
memory makes the copy truly asynchronous, so a step's inputs for the sampler and for every
draft pass are queued while the GPU is still busy. PyTorch's caching host allocator keeps a
pinned block alive until the copy that reads it has completed.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import torch


def host_tensor(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a host tensor to copy to ``device`` with ``non_blocking=True`` (pinned
    when ``device`` is CUDA)."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed host tensor to fill and then copy to ``device`` (pinned when that is CUDA)."""
    return torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")


def to_device(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype)`` on ``device``, copied asynchronously on CUDA."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return host_tensor(values, dtype, device).to(device, non_blocking=True)


def fill_rows(table: torch.Tensor, rows: Sequence[Sequence[int]]) -> None:
    """``table[r, :len(row)] = row`` for each row of a host tensor (block tables),
    through a numpy view in one masked assignment: the rows' entries, concatenated, fill the
    leading ``len(row)`` columns of each row in row-major order. Row by row (a slice
    assignment each) this took ~1.2 us a row on the CPU machine, 0.30-0.32 ms at batch 256,
    paid by every step's target inputs and every draft program; masked, 0.21-0.23 ms
    (``scripts/host_row_micro.py``). A row longer than the table raises ValueError."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    if lengths.size and int(lengths.max()) > table.shape[1]:
        raise ValueError(f"a row of {int(lengths.max())} entries does not fit a table "
                         f"{table.shape[1]} wide")
    view = table.numpy()
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=view.dtype,
                       count=int(lengths.sum()))
    view[:len(rows)][np.arange(view.shape[1]) < lengths[:, None]] = flat
