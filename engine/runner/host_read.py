"""A step's host read that does not wait for work queued after it."""

from __future__ import annotations

import time
from typing import Optional

import torch


class HostRead:
    """An asynchronous device-to-host copy of a small tensor; ``rows()`` waits for it alone.

    On CUDA the copy lands in pinned memory and an event marks its end; the stream may hold
    later work (the next step) that ``rows()`` does not wait for. On CPU the tensor is already
    on the host."""

    def __init__(self, t: torch.Tensor):
        self.event: Optional[torch.cuda.Event] = None
        self.waited: Optional[float] = None   # seconds ``rows`` blocked (CUDA only)
        if t.device.type == "cuda":
            self.buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.buffer.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.buffer = t

    def rows(self) -> list:
        if self.event is not None:
            t0 = time.perf_counter()
            self.event.synchronize()
            self.waited = time.perf_counter() - t0
        return self.buffer.tolist()
