"""Time the target and draft parts of one step without a host sync of their own.

On CPU the work is synchronous, so wall-clock marks are the work's time. On CUDA the host only
queues kernels: marks are CUDA events recorded on the stream, read after the step's own host read
(which has drained the stream), so they measure GPU time and add no synchronisation.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class PhaseClock:
    """``mark()`` at phase boundaries, then ``seconds(a, b)`` once the step's results are read."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return max(0.0, end - start)
        end.synchronize()   # already complete after the step's host read: returns at once
        return start.elapsed_time(end) / 1000.0
