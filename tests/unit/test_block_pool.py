"""BlockPool: reference counts, the LRU free queue, and the prefix-cache index (no torch)."""

from __future__ import annotations

import pytest

from specserve.engine.kv_cache import BlockPool, block_keys


def _keys(tokens: list[int], block_size: int = 4) -> list:
    return block_keys(tokens, block_size, len(tokens) // block_size)


def test_allocate_and_free_counts():
    pool = BlockPool(8)
    assert pool.num_free == 8 and pool.usage == 0.0
    a = pool.allocate(3)
    assert a == [0, 1, 2] and pool.num_free == 5 and pool.usage == pytest.approx(3 / 8)
    assert all(pool.ref_cnt[b] == 1 for b in a)
    pool.free(a)
    assert pool.num_free == 8
    pool.check_all_free()


def test_allocate_more_than_free_raises_and_takes_nothing():
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(RuntimeError, match="only 1 free"):
        pool.allocate(2)
    assert pool.num_free == 1


def test_needs_at_least_one_block():
    with pytest.raises(ValueError):
        BlockPool(0)


def test_free_queue_is_lru_and_tail_blocks_are_evicted_first():
    pool = BlockPool(6)
    first = pool.allocate(3)                 # [0, 1, 2]
    second = pool.allocate(2)                # [3, 4]
    pool.free(first)                         # queue: 5, 2, 1, 0 (tail of a table goes first)
    pool.free(second)                        # queue: 5, 2, 1, 0, 4, 3
    assert list(pool.free_queue) == [5, 2, 1, 0, 4, 3]
    assert pool.allocate(6) == [5, 2, 1, 0, 4, 3]


def test_double_free_is_caught():
    pool = BlockPool(2)
    b = pool.allocate(1)
    pool.free(b)
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(b)


def test_lookup_returns_longest_registered_prefix_and_takes_references():
    pool = BlockPool(8)
    keys = _keys(list(range(12)))            # three blocks of 4
    blocks = pool.allocate(3)
    for b, k in zip(blocks, keys):
        pool.register(b, k)
    assert pool.lookup(keys) == blocks
    assert [pool.ref_cnt[b] for b in blocks] == [2, 2, 2]
    other = _keys(list(range(8)) + [99, 98, 97, 96])
    assert pool.lookup(other) == blocks[:2]  # stops at the first miss
    assert pool.lookup(_keys([50, 51, 52, 53])) == []


def test_prefix_hits_keep_blocks_alive_until_the_last_user_frees():
    pool = BlockPool(4)
    keys = _keys([1, 2, 3, 4, 5, 6, 7, 8])
    owner = pool.allocate(2)
    for b, k in zip(owner, keys):
        pool.register(b, k)
    sharer = pool.lookup(keys)
    pool.free(owner)
    assert pool.num_free == 2                # still referenced by the sharer
    with pytest.raises(AssertionError, match="2 KV blocks still referenced"):
        pool.check_all_free()
    pool.free(sharer)
    pool.check_all_free()


def test_freed_cached_blocks_can_be_hit_again_until_reallocated():
    pool = BlockPool(3)
    keys = _keys([1, 2, 3, 4, 5, 6, 7, 8])
    blocks = pool.allocate(2)                # [0, 1]
    for b, k in zip(blocks, keys):
        pool.register(b, k)
    pool.free(blocks)                        # queue: 2, 1, 0
    assert pool.lookup(keys) == [0, 1]       # revived from the free queue
    assert pool.num_free == 1 and list(pool.free_queue) == [2]
    pool.free([0, 1])                        # queue: 2, 1, 0
    taken = pool.allocate(2)                 # evicts the least recently freed: 2 then 1
    assert taken == [2, 1]
    assert pool.block_key[1] is None and keys[1] not in pool.cached
    assert pool.lookup(keys) == [0]          # the chain now breaks at block 1
    pool.free([0])
    pool.free(taken)
    pool.check_all_free()


def test_register_keeps_the_first_block_for_a_key():
    pool = BlockPool(4)
    key = _keys([1, 2, 3, 4])[0]
    a, b = pool.allocate(2)
    pool.register(a, key)
    pool.register(b, key)
    assert pool.cached[key] == a and pool.block_key[b] is None


def test_prefix_caching_off():
    pool = BlockPool(4, enable_prefix_caching=False)
    key = _keys([1, 2, 3, 4])[0]
    [b] = pool.allocate(1)
    pool.register(b, key)
    assert pool.cached == {} and pool.lookup([key]) == []


def test_block_keys_chain_on_the_predecessor():
    a = block_keys([1, 2, 3, 4, 9, 9, 9, 9], 4, 2)
    b = block_keys([5, 6, 7, 8, 9, 9, 9, 9], 4, 2)
    assert a[1][1] == b[1][1] and a[1] != b[1]   # same tokens, different history
    assert block_keys([1, 2, 3, 4, 9, 9, 9, 9, 1], 4, 2) == a
    assert block_keys([1, 2, 3, 4, 9, 9, 9, 9], 4, 2, start_keys=a[:1]) == a
