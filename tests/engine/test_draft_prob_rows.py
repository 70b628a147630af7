"""Verification reads a batch's stored draft probabilities as one view when they lie together
(engine/runner/verifier.py ``adjacent_rows``): the view must equal ``torch.cat`` of the parts,
and anything that is not one run of adjacent rows must fall back to the concatenation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specserve.engine.runner.verifier import adjacent_rows  # noqa: E402


def _batch(b: int = 5, k: int = 3, v: int = 11) -> list[torch.Tensor]:
    """Request-major rows as runner/draft_loop.py's collect hands them out: [k, V] views."""
    base = torch.randn(k, b, v).transpose(0, 1).contiguous()
    return list(base.unbind(0))


def test_adjacent_rows_are_one_view_equal_to_the_concatenation():
    parts = _batch()
    joined = adjacent_rows(parts)
    assert joined is not None
    assert torch.equal(joined, torch.cat(parts))
    assert joined.data_ptr() == parts[0].data_ptr()           # a view, no copy
    sub = parts[1:4]                                          # a run in the middle
    assert torch.equal(adjacent_rows(sub), torch.cat(sub))


@pytest.mark.parametrize("case", ["gap", "reordered", "short_row", "position_major", "two_storages"])
def test_anything_else_is_left_to_the_concatenation(case):
    parts = _batch()
    if case == "gap":
        parts = [parts[0], parts[2]]
    elif case == "reordered":
        parts = [parts[1], parts[0]]
    elif case == "short_row":                  # a request verifying fewer drafts than it holds
        parts = [parts[0][:2], parts[1]]
    elif case == "position_major":             # [k, B, V] views: a request's rows B * V apart
        parts = list(torch.randn(3, 5, 11).unbind(1))
    else:
        parts = [parts[0], parts[1].clone()]
    assert adjacent_rows(parts) is None


@pytest.mark.parametrize("k_most", [1, 2, 3])
def test_the_draft_programs_batch_copy_is_a_copy_and_request_major(k_most):
    """runner/draft_loop.py ``collect``: each request's q rows are its own copy (the program's
    buffer is overwritten by its next run, which may come before a request is verified), and
    a batch whose rows all drafted k_most is adjacent, request by request. With k = 1 the
    transposed slice is contiguous already: a .contiguous() there handed out views."""
    from specserve.engine.runner.draft_loop import DraftLoop

    b, v = 4, 7
    loop = type("Loop", (), {"probs": torch.randn(5, 6, v)})()
    table = [[10 + i] * k_most for i in range(b)]
    drafts, qs = DraftLoop.collect(loop, table, [k_most] * b)
    want = [loop.probs[:k_most, i].clone() for i in range(b)]
    loop.probs.fill_(-1.0)                       # the next run overwrites the buffer
    assert drafts == table
    assert all(torch.equal(q, w) for q, w in zip(qs, want))
    assert torch.equal(adjacent_rows(qs), torch.cat(want))
