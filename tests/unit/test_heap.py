"""engine/heap.py: the start-up freeze keeps long-lived objects out of the collector's passes."""

import gc
import weakref

from specserve.engine import heap


def test_settle_freezes_what_exists_and_raises_only_the_youngest_threshold() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 13)
        long_lived = [object() for _ in range(1000)]   # noqa: F841 (alive across the freeze)
        frozen = heap.settle_after_startup()
        # (other threads' frozen objects may be freed meanwhile: the count can only shrink)
        assert frozen >= 1000 and 0 < gc.get_freeze_count() <= frozen
        assert gc.get_threshold() == (heap.GEN0_THRESHOLD, 11, 13)
        gc.set_threshold(10 * heap.GEN0_THRESHOLD, 11, 13)
        heap.settle_after_startup()
        assert gc.get_threshold()[0] == 10 * heap.GEN0_THRESHOLD   # a larger setting is kept
        heap.unfreeze()
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == (700, 11, 13)   # as the first settle found it
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_frozen_cycle_is_kept_until_unfrozen() -> None:
    class Node:
        pass

    before = gc.get_threshold()
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        heap.settle_after_startup()
        del a, b
        gc.collect()
        assert ref() is not None   # frozen: a cycle the collector no longer sees
        heap.unfreeze()
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
