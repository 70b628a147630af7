"""engine/runner/transfer.py's block-table fill: the masked numpy assignment writes exactly what a
row-by-row slice assignment writes."""

from __future__ import annotations

import random

import pytest
import torch

from specserve.engine.runner.transfer import fill_rows


def _row_by_row(table: torch.Tensor, rows: list[list[int]]) -> None:
    for r, row in enumerate(rows):
        if row:
            table[r, :len(row)] = torch.tensor(row, dtype=table.dtype)


@pytest.mark.parametrize("seed", range(5))
def test_fill_rows_writes_what_a_slice_per_row_writes(seed):
    rng = random.Random(seed)
    width = 24
    rows = [[rng.randrange(0, 1 << 20) for _ in range(rng.choice([0, 1, 5, width]))]
            for _ in range(rng.randrange(1, 40))]
    height = len(rows) + rng.randrange(0, 4)   # a table may have rows past the batch's
    got = torch.full((height, width), -7, dtype=torch.int32)
    want = got.clone()
    fill_rows(got, rows)
    _row_by_row(want, rows)
    assert torch.equal(got, want)


def test_fill_rows_refuses_a_row_wider_than_the_table():
    table = torch.zeros((2, 3), dtype=torch.int32)
    with pytest.raises(ValueError, match="does not fit"):
        fill_rows(table, [[1, 2], [1, 2, 3, 4]])
    fill_rows(table, [])
    assert not table.any()
