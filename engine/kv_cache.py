"""The paged KV cache's bookkeeping: a pool of fixed-size blocks with prefix caching.

Plain Python (no torch). The tensors themselves live in the model runner; here a block is an
index. The target and the draft model use the same block ids (each model has its own cache
tensors), so a request's blocks are allocated and freed together for both models.

Prefix caching: a full block whose tokens are committed and computed by the target is registered
under a key chained from its predecessor's, ``(hash(previous key), tokens)``. A new request reuses
the longest registered chain of its tokens. The draft model's KV in a block may come later (a
request held at k = 0 does not run the draft), so each block also says whether the draft's half
is written: a request that reuses a block without it starts its draft KV behind the target's and
catches up in the first step that either runs a prefill chunk not ending its prompt (the
draft's KV-only forward that keeps a prefilling request level) or drafts. Blocks whose reference count drops to
zero go to the tail of an LRU free queue but keep their key until the block is reallocated, so a
later request (or a preempted one coming back) can still hit them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Optional

from specserve.engine.request import Request

BlockKey = tuple[int, tuple[int, ...]]


class BlockPool:
    """Reference-counted blocks, an LRU free queue and the prefix-cache index."""

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_cnt = [0] * num_blocks
        self.block_key: list[Optional[BlockKey]] = [None] * num_blocks
        self.draft_ready = [False] * num_blocks   # the draft model's KV of the block is written
        self.cached: dict[BlockKey, int] = {}
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue (least recently freed first)."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} blocks with only {self.num_free} free")
        out = []
        for _ in range(n):
            block, _ = self.free_queue.popitem(last=False)
            key = self.block_key[block]
            if key is not None:  # evict its old prefix-cache identity
                if self.cached.get(key) == block:
                    del self.cached[key]
                self.block_key[block] = None
            self.draft_ready[block] = False
            self.ref_cnt[block] = 1
            out.append(block)
        return out

    def free(self, blocks: list[int]) -> None:
        """Drop one reference from each block; tail blocks first so they are evicted first."""
        for block in reversed(blocks):
            self.ref_cnt[block] -= 1
            assert self.ref_cnt[block] >= 0, f"block {block} freed twice"
            if self.ref_cnt[block] == 0:
                self.free_queue[block] = None

    def lookup(self, keys: list[BlockKey]) -> list[int]:
        """Blocks of the longest registered prefix of ``keys``; each gains a reference."""
        hits: list[int] = []
        if not self.enable_prefix_caching:
            return hits
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        for block in hits:
            if self.ref_cnt[block] == 0:
                del self.free_queue[block]
            self.ref_cnt[block] += 1
        return hits

    def register(self, block: int, key: BlockKey) -> None:
        if not self.enable_prefix_caching or key in self.cached:
            return
        self.block_key[block] = key
        self.cached[key] = block

    def mark_draft_ready(self, block: int) -> None:
        """The draft model's KV of ``block`` is now written (kept until the block is reallocated)."""
        self.draft_ready[block] = True

    def check_all_free(self) -> None:
        """Raise if any block is still referenced (used by tests and leak checks)."""
        held = [b for b, c in enumerate(self.ref_cnt) if c]
        if held or self.num_free != self.num_blocks:
            raise AssertionError(f"{len(held)} KV blocks still referenced: {held[:16]}")


def block_keys(token_ids: list[int], block_size: int, num_blocks: int,
               start_keys: Optional[list[BlockKey]] = None) -> list[BlockKey]:
    """Chained keys of the first ``num_blocks`` full blocks of ``token_ids``."""
    keys = list(start_keys or [])
    prev = hash(keys[-1]) if keys else 0
    for i in range(len(keys), num_blocks):
        key = (prev, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        keys.append(key)
        prev = hash(key)
    return keys


class KVCacheManager:
    """Per-request block tables over a :class:`BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self._keys: dict[str, list[BlockKey]] = {}
        self._draft_ready: dict[str, int] = {}   # leading blocks of a request marked draft-ready

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_for(self, num_slots: int) -> int:
        return -(-num_slots // self.block_size)

    def claim_prefix(self, req: Request) -> int:
        """Reuse cached blocks for a request with no KV; returns the number of tokens covered.

        At least one token is always left to compute, so the step still produces logits.
        """
        assert not req.block_ids and req.num_computed_tokens == 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0 or not self.pool.enable_prefix_caching:
            return 0
        keys = block_keys(req.token_ids, self.block_size, max_blocks)
        hits = self.pool.lookup(keys)
        req.block_ids = hits
        req.num_hashed_blocks = len(hits)
        self._keys[req.request_id] = keys[:len(hits)]
        ready = 0
        while ready < len(hits) and self.pool.draft_ready[hits[ready]]:
            ready += 1
        self._draft_ready[req.request_id] = ready
        return len(hits) * self.block_size

    def claimed_draft_tokens(self, req: Request) -> int:
        """Of the prefix :meth:`claim_prefix` gave ``req``, the leading tokens whose draft KV is
        written too (the draft model's computed count to start from)."""
        return self._draft_ready.get(req.request_id, 0) * self.block_size

    def fits(self, growth: Iterable[tuple[Request, int]]) -> bool:
        """Whether every ``(request, num_slots)`` table can grow to its slots at once."""
        bs, need = self.block_size, 0   # every step at every row: no call per row
        for req, n in growth:
            more = -(-n // bs) - len(req.block_ids)   # blocks_for(n), inline
            if more > 0:
                need += more
        return need <= self.pool.num_free

    def allocate(self, req: Request, num_slots: int) -> bool:
        """Grow the block table to hold ``num_slots`` positions; False if the pool is short."""
        need = self.blocks_for(num_slots) - len(req.block_ids)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.block_ids.extend(self.pool.allocate(need))
        return True

    def free(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_hashed_blocks = 0
        self._keys.pop(req.request_id, None)
        self._draft_ready.pop(req.request_id, None)

    def commit(self, req: Request, num_valid_tokens: int, num_draft_valid: Optional[int] = None) -> None:
        """Register the full blocks of ``req.token_ids[:num_valid_tokens]`` in the prefix cache,
        and mark those within the first ``num_draft_valid`` tokens draft-ready.

        ``num_valid_tokens`` must count only committed tokens whose target KV is computed;
        ``num_draft_valid`` (None: no draft model, every block is ready) those whose draft KV is.
        """
        if not self.pool.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(num_valid_tokens, len(req.token_ids), len(req.block_ids) * bs) // bs
        if full > req.num_hashed_blocks:
            keys = block_keys(req.token_ids, self.block_size, full, self._keys.get(req.request_id))
            for i in range(req.num_hashed_blocks, full):
                self.pool.register(req.block_ids[i], keys[i])
            self._keys[req.request_id] = keys
            req.num_hashed_blocks = full
        ready = req.num_hashed_blocks
        if num_draft_valid is not None:
            ready = min(ready, num_draft_valid // self.block_size)
        done = self._draft_ready.get(req.request_id, 0)
        if ready > done:   # (most steps of most rows complete no block: nothing to write)
            for i in range(done, ready):
                self.pool.mark_draft_ready(req.block_ids[i])
            self._draft_ready[req.request_id] = ready
