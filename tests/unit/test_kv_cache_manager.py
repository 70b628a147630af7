"""KVCacheManager: block tables, claim_prefix and commit over the pool (no torch)."""

from __future__ import annotations

from specserve.engine.kv_cache import KVCacheManager
from specserve.engine.request import Request
from specserve.engine.types import SamplingParams

BS = 4


def _req(rid: str, tokens: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens), 0, (0,), max_tokens, 0.0)


def _computed(kv: KVCacheManager, req: Request) -> None:
    """As if the whole request had been computed: blocks for every token, registered."""
    assert kv.allocate(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    kv.commit(req, req.num_tokens)


def test_blocks_for():
    kv = KVCacheManager(8, BS)
    assert [kv.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_grows_the_table_or_refuses_whole():
    kv = KVCacheManager(4, BS)
    r = _req("a", list(range(10)))
    assert kv.allocate(r, 10) and len(r.block_ids) == 3
    assert kv.allocate(r, 12) and len(r.block_ids) == 3       # already enough
    assert not kv.allocate(r, 17)                             # needs 2 more, 1 free
    assert len(r.block_ids) == 3 and kv.pool.num_free == 1
    kv.free(r)
    assert r.block_ids == [] and r.num_hashed_blocks == 0
    kv.pool.check_all_free()


def test_commit_registers_full_blocks_of_valid_tokens_only():
    kv = KVCacheManager(8, BS)
    r = _req("a", list(range(11)))
    kv.allocate(r, 11)
    kv.commit(r, 7)                                           # one full block valid
    assert r.num_hashed_blocks == 1 and len(kv.pool.cached) == 1
    kv.commit(r, 11)                                          # two full blocks, the third partial
    assert r.num_hashed_blocks == 2 and len(kv.pool.cached) == 2
    kv.commit(r, 11)                                          # idempotent
    assert len(kv.pool.cached) == 2
    r.token_ids.append(11)                                    # the third block fills up
    kv.allocate(r, 12)
    kv.commit(r, 12)
    assert r.num_hashed_blocks == 3 and len(kv.pool.cached) == 3
    kv.free(r)


def test_claim_prefix_shares_blocks_and_always_leaves_a_token():
    kv = KVCacheManager(16, BS)
    a = _req("a", list(range(12)))
    _computed(kv, a)
    b = _req("b", list(range(12)) + [50, 51])                 # the same three blocks, then more
    assert kv.claim_prefix(b) == 12
    assert b.block_ids == a.block_ids and b.num_hashed_blocks == 3
    assert all(kv.pool.ref_cnt[x] == 2 for x in a.block_ids)
    c = _req("c", list(range(12)))                            # identical prompt
    assert kv.claim_prefix(c) == 8                            # the last token is recomputed
    d = _req("d", list(range(4)) + [77] * 8)                  # diverges in the second block
    assert kv.claim_prefix(d) == 4
    e = _req("e", [1, 2, 3])                                  # shorter than a block
    assert kv.claim_prefix(e) == 0 and e.block_ids == []
    for r in (a, b, c, d):
        kv.free(r)
    kv.pool.check_all_free()


def test_claimed_prefix_then_commit_continues_the_chain():
    kv = KVCacheManager(16, BS)
    a = _req("a", list(range(8)))
    _computed(kv, a)
    b = _req("b", list(range(8)) + [20, 21, 22, 23, 24])
    assert kv.claim_prefix(b) == 8
    b.num_computed_tokens = 8
    assert kv.allocate(b, 13)
    kv.commit(b, 13)
    assert b.num_hashed_blocks == 3
    c = _req("c", list(range(8)) + [20, 21, 22, 23, 99])
    assert kv.claim_prefix(c) == 12                           # a's two blocks + b's third
    assert c.block_ids == b.block_ids[:3]
    for r in (a, b, c):
        kv.free(r)
    kv.pool.check_all_free()


def test_freed_prefix_survives_in_the_cache():
    kv = KVCacheManager(4, BS)
    a = _req("a", list(range(9)))
    _computed(kv, a)
    blocks = list(a.block_ids)
    kv.free(a)
    kv.pool.check_all_free()
    again = _req("again", list(range(9)))
    assert kv.claim_prefix(again) == 8 and again.block_ids == blocks[:2]
    kv.free(again)


def test_prefix_caching_disabled_claims_nothing():
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    a = _req("a", list(range(9)))
    _computed(kv, a)
    b = _req("b", list(range(9)))
    assert kv.claim_prefix(b) == 0
    kv.free(a)
    kv.pool.check_all_free()


def test_blocks_register_with_the_target_and_become_draft_ready_with_the_draft():
    """A request held at k = 0 computes no draft KV: its blocks are still cached (for the target),
    and a request reusing them starts its draft KV at the leading blocks the draft has written."""
    kv = KVCacheManager(16, BS)
    a = _req("a", list(range(13)))
    assert kv.allocate(a, 13)
    kv.commit(a, 13, num_draft_valid=0)                       # target only
    assert a.num_hashed_blocks == 3 and len(kv.pool.cached) == 3
    b = _req("b", list(range(13)))
    assert kv.claim_prefix(b) == 12 and kv.claimed_draft_tokens(b) == 0
    kv.free(b)
    kv.commit(a, 13, num_draft_valid=6)                       # the draft wrote one block and a half
    c = _req("c", list(range(13)))
    assert kv.claim_prefix(c) == 12 and kv.claimed_draft_tokens(c) == 4
    kv.commit(c, 13, num_draft_valid=13)                      # c's catch-up writes the shared blocks
    d = _req("d", list(range(13)))
    assert kv.claim_prefix(d) == 12 and kv.claimed_draft_tokens(d) == 12
    for r in (a, c, d):
        kv.free(r)
    kv.pool.check_all_free()


def test_a_reallocated_block_loses_its_draft_readiness():
    kv = KVCacheManager(2, BS)
    a = _req("a", list(range(8)))
    _computed(kv, a)
    assert all(kv.pool.draft_ready[b] for b in a.block_ids)   # no draft model: ready with the target
    kv.free(a)
    other = _req("o", list(range(100, 108)))
    assert kv.allocate(other, 8)                              # evicts both cached blocks
    assert not any(kv.pool.draft_ready)
    kv.free(other)
    kv.pool.check_all_free()


def test_fits_counts_the_growth_of_every_table_together():
    kv = KVCacheManager(4, BS)
    a, b = _req("a", list(range(4))), _req("b", list(range(4)))
    assert kv.allocate(a, 4) and kv.allocate(b, 4)            # two blocks left
    assert kv.fits([(a, 8), (b, 8)])                          # one more each
    assert kv.fits([(a, 4), (b, 12)])                         # a needs none, b two
    assert not kv.fits([(a, 8), (b, 12)])                     # three in all
    assert kv.pool.num_free == 2, "fits reserves nothing"
    for r in (a, b):
        kv.free(r)
