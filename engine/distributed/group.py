"""A tensor-parallel process group held by an object (no torch.distributed default group).

Each engine owns its :class:`TPGroup`; two engines in one process (the tests build many) never
share global state. Gloo on CPU, NCCL on CUDA. The rendezvous is a TCPStore that rank 0 opens on
a free port of 127.0.0.1 (one host only).
"""

from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(minutes=30)


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: picklable, handed to each worker process."""

    host: str
    port: int
    world_size: int
    backend: str            # "gloo" | "nccl"


def open_store(world_size: int) -> tuple[dist.TCPStore, int]:
    """Rank 0's store on a free port: (store, port)."""
    store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=TIMEOUT, wait_for_workers=False)
    return store, store.port


class TPGroup:
    """rank / world size and the four collectives the parallel layers and the step loop use."""

    def __init__(self, rdv: Rendezvous, rank: int, store: dist.TCPStore | None = None,
                 device: torch.device = torch.device("cpu")):
        self.rank, self.world_size, self.backend = rank, rdv.world_size, rdv.backend
        self.device = device
        if store is None:
            store = dist.TCPStore(rdv.host, rdv.port, rdv.world_size, False, timeout=TIMEOUT)
        self._store = store   # kept alive: the process group holds connections made through it
        if rdv.backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(store, rank, rdv.world_size)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, rdv.world_size, TIMEOUT)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns ``x``."""
        self.pg.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., n * world_size], rank order along the last dimension."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.pg.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0 sends ``obj`` (pickled); every rank returns it. Two broadcasts: length, bytes."""
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        size = self._broadcast(size)
        if self.rank != 0:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        data = self._broadcast(data)
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())

    def _broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensors travel through the device for NCCL (it only moves device memory)."""
        if self.backend == "nccl":
            d = t.to(self.device)
            self.pg.broadcast(d, 0).wait()
            return d.cpu()
        self.pg.broadcast(t, 0).wait()
        return t
