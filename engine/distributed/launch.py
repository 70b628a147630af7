"""Rank 0's side of tensor parallelism: spawn the workers, hold the group, send each forward.

The engine (scheduler, KV block manager, draft model, rejection sampler) lives on rank 0 only.
:class:`TPDriver` is the one link from it to the other ranks: ``start(num_blocks)`` once the KV
pool is sized, ``send(items)`` before every target forward, ``close()`` at the end (also run
when the driver is garbage-collected or the interpreter exits).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import weakref

import torch

from specserve.engine.distributed.group import Rendezvous, TPGroup, open_store
from specserve.engine.distributed.worker import WorkerArgs, device_of

log = logging.getLogger("specserve.tp")


class TPDriver:
    def __init__(self, group: TPGroup, procs: list):
        self.group, self.procs = group, procs
        self._finalizer = weakref.finalize(self, _shutdown, group, procs)

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def start(self, num_blocks: int, max_seq_len_bound: int | None) -> None:
        """Tell the workers the KV pool size (they allocate their share of every block) and the
        attention launch bound rank 0's eager forwards use (``build_inputs``)."""
        self.group.broadcast_object((num_blocks, max_seq_len_bound))

    def send(self, items) -> None:
        """This step's target-forward items to every worker (call right before the forward)."""
        self.group.broadcast_object(items)

    def close(self) -> None:
        self._finalizer()


def _shutdown(group: TPGroup, procs: list) -> None:
    if any(p.is_alive() for p in procs):
        try:
            group.broadcast_object(None)
        except Exception as e:   # a worker already gone: nothing to stop politely
            log.warning("tensor-parallel shutdown: %s", e)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.terminate()


def check_split(spec, tp: int, device: torch.device) -> None:
    """Refuse, before anything is spawned, a target or a machine that cannot take ``tp`` ranks."""
    from specserve.engine.config import ConfigError

    if device.type == "cuda" and torch.cuda.device_count() < tp:
        raise ConfigError(f"--tensor-parallel-size {tp} needs {tp} GPUs; "
                          f"{torch.cuda.device_count()} visible")
    h, kv, inter = spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    if h % tp or (kv % tp and tp % kv) or inter % tp:
        raise ConfigError(f"--tensor-parallel-size {tp} does not split the target: {h} attention heads "
                          f"and {inter} MLP features must divide by it, and its {kv} KV heads must "
                          "divide by it or divide it (then they are replicated)")


def launch(tp: int, spec, device: torch.device, dtype: torch.dtype, kernel_backend: str,
           max_positions: int, load_format: str, seed: int, block_size: int) -> TPDriver:
    """Spawn ranks 1..tp-1 and join them in a group; rank 0 is this process."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        os.environ["NCCL_NVLS_ENABLE"] = "0"    # NVLink multicast off (device notes); children inherit
    t0 = time.monotonic()
    store, port = open_store(tp)
    rdv = Rendezvous("127.0.0.1", port, tp, backend)
    threads = max(1, (os.cpu_count() or 1) // tp)
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, tp):
        args = WorkerArgs(rdv, rank, spec, device.type, dtype, kernel_backend, max_positions,
                          load_format, seed, block_size, threads)
        p = ctx.Process(target=_entry, args=(args,), name=f"specserve-tp{rank}", daemon=True)
        p.start()
        procs.append(p)
    group = TPGroup(rdv, 0, store, device_of(device.type, 0) if device.type == "cuda" else device)
    log.info("tensor parallel: %d ranks over %s, joined in %.1fs", tp, backend, time.monotonic() - t0)
    return TPDriver(group, procs)


def _entry(args: WorkerArgs) -> None:
    from specserve.engine.distributed.worker import worker_main

    worker_main(args)
