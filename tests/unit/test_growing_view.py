"""GrowingView: an O(1) snapshot of a list that only grows by appends."""

from __future__ import annotations

import pytest

from specserve.engine.types import GrowingView


def test_a_view_is_the_slice_it_was_taken_as_whatever_is_appended_after() -> None:
    items = [10, 11, 12, 13]
    view = GrowingView(items, 1)
    items.extend([14, 15])
    assert len(view) == 3 and list(view) == [11, 12, 13]
    assert view == [11, 12, 13] and view == (11, 12, 13) and view != [11, 12, 13, 14]
    assert view[0] == 11 and view[-1] == 13 and view[-3] == 11
    assert view[1:] == [12, 13] and view[5:] == [] and view[:-1] == [11, 12] and view[::2] == [11, 13]
    with pytest.raises(IndexError):
        view[3]
    with pytest.raises(IndexError):
        view[-4]
    assert GrowingView(items, 2, 4) == GrowingView([12, 13])
    assert repr(view) == "GrowingView([11, 12, 13])"


def test_an_empty_view_and_a_view_of_everything() -> None:
    items: list[int] = [1, 2]
    assert len(GrowingView(items, 2)) == 0 and list(GrowingView(items, 2)) == []
    assert GrowingView(items) == [1, 2] and list(reversed(GrowingView(items))) == [2, 1]
    assert 2 in GrowingView(items) and GrowingView(items).index(2) == 1
