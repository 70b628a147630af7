"""Keeping Python's cyclic garbage collector out of the decode loop.

A decode step at batch 256 allocates thousands of small containers (results, outputs, token
lists). Every few steps that trips a collection, and a full (oldest-generation) collection walks
every tracked object of the process: the torch modules, the tokenizer, transformers' and
FastAPI's import-time objects. On the 2-core CPU machine, with 1-layer models at batch 256, those
pauses took 190 ms while a step took 9 ms, and lifted the mean step time by a fifth; on the H100 a
speculative engine's batch-256 steps showed a 230 ms pause. The collector holds the GIL, so the
server's event loop (streaming, new requests) stops with it.

``settle_after_startup`` runs once everything long-lived exists (models loaded, graphs captured,
the app built): it collects once, moves every surviving object into the collector's permanent
generation (``gc.freeze``: never walked again; reference counting still frees them), and raises
the youngest generation's threshold so collections of short-lived step garbage come less often.
Objects frozen in a reference cycle are never collected, so a process that builds and drops
several engines (the bench) calls ``unfreeze`` before dropping one.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("specserve.engine")

# Allocations (net of deallocations) between youngest-generation collections; Python's default is
# 700, which a batch-256 step exceeds several times over.
GEN0_THRESHOLD = 50_000


_threshold_before: list[tuple[int, int, int]] = []   # as settle_after_startup found it, once


def settle_after_startup() -> int:
    """Collect, freeze everything alive now, and raise the youngest threshold (never lowers a
    larger one). Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if not _threshold_before:
        _threshold_before.append((gen0, gen1, gen2))
    gc.set_threshold(max(gen0, GEN0_THRESHOLD), gen1, gen2)
    frozen = gc.get_freeze_count()
    log.info("garbage collector: %d start-up objects frozen out of its passes; youngest-generation "
             "threshold %d", frozen, gc.get_threshold()[0])
    return frozen


def unfreeze() -> None:
    """Give frozen objects back to the collector and restore the threshold found by the first
    ``settle_after_startup`` (before dropping an engine whose reference cycles should be
    collected)."""
    gc.unfreeze()
    if _threshold_before:
        gc.set_threshold(*_threshold_before.pop())
